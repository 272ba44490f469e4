"""Tensor parallelism inside a mixture of experts (``blockir.lower.layers.moe.MoE``), as the plan's
``parallel_moe.py`` derives it.

Under tensor parallelism the branch runs on plain local tensors between one gather of its input and one
reduction of its output: the router and a shared expert's gate on replicated weights, each expert's gate/up
rows (stored as the rank's slice of the gate block and of the up block) and down columns of this rank's
hidden units, a shared expert split as a gated MLP. A replicated weight is read through ``to_local`` with a
pending-sum gradient: each rank's gradient is its summand (the router's too, since the routing weights
multiply this rank's partial outputs). Under the context layout (``ExpertRows``) every weight is whole and
replicated, read the same way, and the branch runs on the rank's own rows of the sequence: nothing is
gathered or reduced.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle
from torch.distributed.tensor.placement_types import Placement, _StridedShard

from blockir.lower.distributed.placing import Source, place, source_of
from blockir.lower.distributed.projections import BranchInput, branch_input


def _local_linear(linear: nn.Module, mesh: DeviceMesh, placement: Placement, source: Source) -> None:
    """A bias-free ``nn.Linear`` whose weight is stored ``placement`` and multiplied as this rank's local
    tensor; a replicated one's gradient is this rank's summand."""
    place(linear, "weight", mesh, [placement], source)
    grad = [Partial()] if isinstance(placement, Replicate) else None

    def forward(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, linear.weight.to_local(grad_placements=grad))

    linear.forward = forward  # type: ignore[method-assign]


def _linears(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The branch's linears outside its experts, by role: the router, and the shared expert's gate, up and
    down and the gate on its output where it has them."""
    names = module.names
    found = [("router", getattr(module, names["router"]))]
    if module.has_shared:
        shared = getattr(module, names["shared"])
        found += [(role, getattr(shared, shared.names[role])) for role in ("gate", "up", "down")]
        if module.has_gate:
            found.append(("shared_gate", getattr(module, names["shared_gate"])))
    return found


# the shared expert split as an MLP is; the router and the shared expert's gate replicated
SHARED_SPLIT = {"gate": Shard(0), "up": Shard(0), "down": Shard(1)}


class ExpertColumns(ParallelStyle):
    """Split every expert of an ``MoE`` by hidden units over the mesh; the branch's output, a pending sum, is
    brought to ``stream`` (all-reduce to replicated, reduce-scatter to a shard), a plain tensor when
    ``use_local_output``."""

    def __init__(self, stream: Placement, use_local_output: bool) -> None:
        super().__init__()
        self.stream, self.use_local_output = stream, use_local_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        mesh, source = device_mesh, source_of(self)
        for role, linear in _linears(module):
            _local_linear(linear, mesh, SHARED_SPLIT.get(role, Replicate()), source)
        experts = getattr(module, module.names["experts"])
        # its gate rows and its up rows: its slice of each of the two blocks of dim 1
        place(experts, "gate_up_proj", mesh, [_StridedShard(1, split_factor=2)], source)
        place(experts, "down_proj", mesh, [Shard(2)], source)

        def matrices() -> tuple[torch.Tensor, torch.Tensor]:
            return experts.gate_up_proj.to_local(), experts.down_proj.to_local()

        experts.matrices = matrices  # type: ignore[method-assign]
        BranchInput(self.stream)._apply(module, mesh)
        forward = module.forward

        def parallel(x: torch.Tensor, **ctx: object) -> torch.Tensor:
            y = forward(branch_input(x, mesh), **ctx)
            y = DTensor.from_local(y, mesh, [Partial()], run_check=False).redistribute(mesh, [self.stream])
            return y.to_local() if self.use_local_output else y

        module.forward = parallel  # type: ignore[method-assign]
        return module


class ExpertRows(ParallelStyle):
    """Context parallelism: an ``MoE`` whose every weight is replicated, routing this rank's rows of the
    sequence-sharded stream on plain tensors and handing its output back as a sequence shard. Routing is
    row by row, so the rows a rank holds pick the experts one process picks for them."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        mesh, source = device_mesh, source_of(self)
        for _, linear in _linears(module):
            _local_linear(linear, mesh, Replicate(), source)
        experts = getattr(module, module.names["experts"])
        for name in ("gate_up_proj", "down_proj"):
            place(experts, name, mesh, [Replicate()], source)

        def matrices() -> tuple[torch.Tensor, torch.Tensor]:
            return (experts.gate_up_proj.to_local(grad_placements=[Partial()]),
                    experts.down_proj.to_local(grad_placements=[Partial()]))

        experts.matrices = matrices  # type: ignore[method-assign]
        forward = module.forward

        def rows(x: torch.Tensor, **ctx: object) -> torch.Tensor:
            stream = x.placements if isinstance(x, DTensor) else [Shard(1)]
            y = forward(x.to_local() if isinstance(x, DTensor) else x, **ctx)
            return DTensor.from_local(y, mesh, stream, run_check=False)

        module.forward = rows  # type: ignore[method-assign]
        return module
