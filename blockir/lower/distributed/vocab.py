"""A token embedding and a head split by vocabulary rows (Megatron-LM's vocab-parallel embedding and
column-parallel head; torchtitan's ``RowwiseParallel`` on the embedding and ``ColwiseParallel`` on the head
with ``Shard(-1)`` logits for ``loss_parallel``).

Both hold rows ``r·V/P … (r+1)·V/P`` of the ``[V, D]`` table on rank ``r``. The embedding looks up the ids in
its range and gives zero rows elsewhere, so the ranks' outputs are the summands of the full lookup, reduced
onto the stream's layout. The head computes its ranks' logit columns from full rows of the stream and
returns them as a ``Shard(-1)`` DTensor: the logits are never gathered. A tied table is one parameter, split
once, which both read; its gradient on each rank is that of its own rows.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle
from torch.distributed.tensor.placement_types import Placement

from blockir.lower.distributed.placing import Source, placed
from blockir.lower.distributed.projections import branch_input


def shard_tables(module: nn.Module, paths: list[str], mesh: DeviceMesh, source: Source = 0) -> None:
    """Split the weight (and bias) of every module at ``paths`` by rows, each tensor once under all the names
    that hold it: a head tied to the embedding reads the very parameter the embedding does."""
    owned = {id(getattr(module.get_submodule(p), leaf)) for p in paths for leaf in ("weight", "bias")
             if getattr(module.get_submodule(p), leaf, None) is not None}
    split: dict[int, nn.Parameter] = {}
    for name, param in list(module.named_parameters(remove_duplicate=False)):
        if id(param) in owned:
            if id(param) not in split:
                split[id(param)] = placed(param.data, mesh, [Shard(0)], source, param.requires_grad)
            owner, _, leaf = name.rpartition(".")
            (module.get_submodule(owner) if owner else module).register_parameter(leaf, split[id(param)])


def _rows(mesh: DeviceMesh, vocab: int) -> tuple[int, int]:
    share = vocab // mesh.size()
    return mesh.get_local_rank() * share, (mesh.get_local_rank() + 1) * share


class VocabRows(ParallelStyle):
    """A token embedding over its rank's vocabulary rows; the lookup's summands are reduced onto ``stream``
    (all-reduce to replicated, reduce-scatter to a shard). A replicated stream is handed on as a plain tensor,
    a sharded one as a DTensor, as a row-parallel projection's output is."""

    def __init__(self, stream: Placement) -> None:
        super().__init__()
        self.stream = stream

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        start, stop = _rows(device_mesh, module.weight.shape[0])
        pad = module.padding_idx
        local_pad = pad - start if pad is not None and start <= pad < stop else None

        def forward(ids: torch.Tensor, **ctx: object) -> torch.Tensor:
            ids = ids.long()
            mine = (ids >= start) & (ids < stop)
            y = F.embedding(torch.where(mine, ids - start, 0), module.weight.to_local(), local_pad)
            y = y * mine.unsqueeze(-1).to(y.dtype)  # ids outside this rank's rows contribute zero rows
            if module.scale is not None:
                y = y * torch.tensor(module.scale, dtype=y.dtype)
            y = DTensor.from_local(y, device_mesh, [Partial()], run_check=False).redistribute(
                device_mesh, [self.stream])
            return y.to_local() if isinstance(self.stream, Replicate) else y

        module.forward = forward  # type: ignore[method-assign]
        return module


class VocabColumns(ParallelStyle):
    """A head over its rank's vocabulary rows: full rows of the stream in (all-gathered if sharded), its logit
    columns out as a ``Shard(-1)`` DTensor. The input gradient is a pending sum, reduced onto the stream's
    layout; a softcap acts on each logit alone, so it runs on the rank's columns."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def forward(x: torch.Tensor, **ctx: object) -> torch.Tensor:
            if isinstance(x, DTensor):
                x = x.redistribute(device_mesh, [Replicate()])
            x = branch_input(x, device_mesh)
            bias = module.bias.to_local() if module.bias is not None else None
            logits = F.linear(x, module.weight.to_local(), bias)
            if module.softcap is not None:
                logits = torch.tanh(logits / module.softcap) * module.softcap
            return DTensor.from_local(logits, device_mesh, [Shard(logits.dim() - 1)], run_check=False)

        module.forward = forward  # type: ignore[method-assign]
        return module
