"""Making a module's parameters DTensors, for every style and pass of ``parallelize`` alike.

``source`` is where the values come from (torch's ``src_data_rank``): 0, the default, sends rank 0's values to
every rank (broadcast for a replicated placement, scatter for a shard), so the ranks agree whatever each held;
None takes every rank's own values, sending nothing, for ranks that already hold the same weights (each loaded
the same checkpoint, or compiled with the same seed)."""
from __future__ import annotations

import inspect
from typing import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import distribute_tensor
from torch.distributed.tensor.placement_types import Placement

Source = int | None
# torch releases before the keyword always send rank 0's values
CHOOSES_SOURCE = "src_data_rank" in inspect.signature(distribute_tensor).parameters


def placed(t: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement], source: Source = 0,
           requires_grad: bool = True) -> nn.Parameter:
    """``t`` as a DTensor parameter of ``placements`` over ``mesh``, its values taken from ``source``."""
    keywords = {} if source == 0 else {"src_data_rank": source}
    return nn.Parameter(distribute_tensor(t, mesh, list(placements), **keywords), requires_grad=requires_grad)


def place(owner: nn.Module, name: str, mesh: DeviceMesh, placements: Sequence[Placement], source: Source = 0) -> None:
    """Replace ``owner``'s parameter ``name`` with its DTensor of ``placements``."""
    p = owner.get_parameter(name)
    owner.register_parameter(name, placed(p.data, mesh, placements, source, p.requires_grad))


def source_of(style: object) -> Source:
    """The source a parallel style was given (torch's ``ParallelStyle.src_data_rank``; 0 where torch has none)."""
    return getattr(style, "src_data_rank", 0)
