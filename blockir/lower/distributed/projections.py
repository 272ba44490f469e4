"""Column- and row-parallel projections that ``ColwiseParallel`` / ``RowwiseParallel`` cannot express.

Those styles split an ``nn.Linear`` into contiguous blocks of its output (or input) features. Checkpoints
also store GPT-2's transposed ``Conv1D`` (``[in, out]``) and fused matrices: q, k and v stacked (GPT-2's
``c_attn``, Phi-3's ``qkv_proj``, with grouped key/value heads), gate and up stacked (Phi-3's
``gate_up_proj``) or per head q, k, v in turn (GPT-NeoX's ``query_key_value``, which a contiguous split
cuts into whole heads). Each rank computes the output columns of its own heads or units, in the order the
branch reads them. A stacked matrix of equal blocks (q, k and v of as many heads each; gate and up) is stored
split within every block (``_StridedShard``: each rank holds its slice of each block, and gathering them gives
the checkpoint's tensor back); one whose rank columns are no such pattern (q, k, v with grouped key/value
heads, whose blocks differ in size) stays replicated and each rank reads its rows of it (its gradient is then
a pending sum over the ranks).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle
from torch.distributed.tensor.placement_types import Placement, _StridedShard

from blockir.diagnostics import BlockError, argument_error
from blockir.lower.distributed.placing import place, source_of
from blockir.lower.layers.dense import Conv1D


def branch_input(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """The full rows a column-parallel projection reads, as a plain tensor whose gradient is a pending sum.

    Given the branch's replicated DTensor input, the pending sums of all its projections meet there and are
    reduced once; given a plain tensor, this projection's own gradient is reduced here."""
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    return x.to_local(grad_placements=[Partial()])


def _out_dim(module: nn.Module) -> int:
    return 1 if isinstance(module, Conv1D) else 0


def _apply(x: torch.Tensor, module: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if isinstance(module, Conv1D):
        y = x @ weight
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


def _check(module: nn.Module) -> None:
    if type(module) not in (nn.Linear, Conv1D):
        raise TypeError(f"a tensor-parallel projection must be an nn.Linear or a Conv1D, not {type(module).__name__}")


def stored(blocks: int | None, dim: int) -> Placement:
    """How a column-parallel weight of ``blocks`` equal blocks is stored along ``dim``."""
    return Replicate() if blocks is None else Shard(dim) if blocks == 1 else _StridedShard(dim, split_factor=blocks)


class Columns(ParallelStyle):
    """A column-parallel projection. ``pieces`` are the ``(start, stop)`` ranges of the stored output
    features this rank computes, in order. Where they are its 1/P of each of ``blocks`` equal blocks (the
    plan's ``ModuleStyle.blocks``) the weight is stored split (a plain shard for one block); with ``blocks``
    None it stays replicated and each rank reads its rows. ``split_bias=False`` keeps the bias of several
    blocks replicated, read by rows too: FSDP2 shards a 1-D tensor along its one dim, and composes that shard
    with a strided one as if it were a plain shard (torch 2.13), gathering a wrong tensor (a weight is
    sharded over the data axes along its other dim instead, ``tp.data_shard``)."""

    def __init__(self, pieces: Sequence[tuple[int, int]], blocks: int | None, split_bias: bool = True) -> None:
        super().__init__()
        self.pieces, self.blocks = tuple(pieces), blocks
        self.bias_blocks = blocks if blocks == 1 or split_bias else None

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check(module)
        dim = _out_dim(module)
        stores = {"weight": (self.blocks, dim), "bias": (self.bias_blocks, 0)}
        for name, _ in list(module.named_parameters(recurse=False)):
            place(module, name, device_mesh, [stored(*stores[name])], source_of(self))
        index = torch.cat([torch.arange(a, b) for a, b in self.pieces])

        def own(p: torch.Tensor, blocks: int | None, along: int) -> torch.Tensor:
            if blocks is not None:
                return p.to_local()
            # each rank's rows of a replicated tensor: its gradient there is this rank's summand
            return p.to_local(grad_placements=[Partial()]).index_select(along, index.to(p.device))

        def forward(x: torch.Tensor) -> torch.Tensor:
            x = branch_input(x, device_mesh)
            b = own(module.bias, self.bias_blocks, 0) if module.bias is not None else None
            return _apply(x, module, own(module.weight, self.blocks, dim), b)

        module.forward = forward  # type: ignore[method-assign]
        return module


class Rows(ParallelStyle):
    """A row-parallel ``Conv1D``: the weight split by input features, each rank's product a pending sum
    brought to ``output`` (all-reduce to replicated, reduce-scatter to a shard), then the bias added once."""

    def __init__(self, output: Placement, use_local_output: bool) -> None:
        super().__init__()
        self.output, self.use_local_output = output, use_local_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check(module)
        placements: dict[str, list[Placement]] = {"weight": [Shard(1 - _out_dim(module))], "bias": [Replicate()]}
        for name, _ in list(module.named_parameters(recurse=False)):
            place(module, name, device_mesh, placements[name], source_of(self))

        def forward(x: torch.Tensor) -> torch.Tensor:
            y = _apply(x, module, module.weight.to_local(), None)
            y = DTensor.from_local(y, device_mesh, [Partial()], run_check=False).redistribute(device_mesh, [self.output])
            if module.bias is not None:
                y = y + module.bias
            return y.to_local() if self.use_local_output else y

        module.forward = forward  # type: ignore[method-assign]
        return module


class BranchInput(ParallelStyle):
    """A branch's stream input as one DTensor with full rows (torchtitan's ``PrepareModuleInput``): the stream,
    placed ``stream``, is all-gathered if sharded and handed on replicated, not as a plain tensor. Every
    column-parallel projection of the branch leaves its input gradient there as a pending sum; they add up
    without communication and are reduced once, onto ``stream``, instead of once per projection. Only the
    first input is the stream: a second one (RealFormer's scores) passes as it is. It places no parameter: a
    Post-LN norm inside the branch's module (BERT's ``attention.output.LayerNorm``) is replicated as any other."""

    owns_parameters = False

    def __init__(self, stream: Placement) -> None:
        super().__init__()
        self.stream = stream

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def prepare(_: nn.Module, args: tuple[object, ...]) -> tuple[object, ...]:
            if not args or not isinstance(args[0], torch.Tensor):
                return args
            x = args[0]
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, device_mesh, [self.stream], run_check=False)
            return (x.redistribute(device_mesh, [Replicate()]), *args[1:])

        module.register_forward_pre_hook(prepare)
        return module


class ReplicatedHeads(ParallelStyle):
    """A key/value projection over more ranks than it has heads: the weight is replicated and each rank
    computes only the head its query heads read (rank r of P, head r·kv/P of kv).

    Each rank's weight gradient covers its own head only, so it is a pending sum over the ranks; the input
    gradient is summed over the ranks at once, as a column-parallel projection's is."""

    def __init__(self, kv_heads: int) -> None:
        super().__init__()
        self.kv_heads = kv_heads

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if type(module) is not nn.Linear:
            raise BlockError([argument_error("parallelize", "program", "replicated key/value heads need an nn.Linear "
                                             f"projection, not {type(module).__name__}")])
        head = device_mesh.get_local_rank() * self.kv_heads // device_mesh.size()
        width = module.out_features // self.kv_heads
        rows = slice(head * width, (head + 1) * width)
        for name, _ in list(module.named_parameters(recurse=False)):
            place(module, name, device_mesh, [Replicate()], source_of(self))

        def forward(x: torch.Tensor) -> torch.Tensor:
            # identity forward; backward sums the input gradient over ranks, as a column-parallel input's is
            x = branch_input(x, device_mesh)
            own = [p.to_local(grad_placements=[Partial()])[rows] if p is not None else None
                   for p in (module.weight, module.bias)]
            return F.linear(x, own[0], own[1])

        module.forward = forward  # type: ignore[method-assign]
        return module
