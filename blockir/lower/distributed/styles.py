"""The ``ParallelStyle`` that applies each style a derived plan names (``ModuleStyle.style``).

Every entry of ``STYLES`` builds the style of one submodule from its ``Site``: torch's own styles where they
express the placement (``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``, the ``PrepareModule*``
ones), blockir's where they do not (``projections``, ``experts``, ``context``, ``vocab``). A style name with
no entry, or an entry that gives None, leaves the submodule to the plan's defaults: replicated where the stream
is split (``tp._replicate_rest``), plain tensors where it is not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput,
                                               PrepareModuleInputOutput, PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel)
from torch.distributed.tensor.placement_types import Placement

from blockir.analyses.parallel import ModuleStyle, ParallelPlan
from blockir.lower.distributed.context import ContextAttention
from blockir.lower.distributed.experts import ExpertColumns, ExpertRows
from blockir.lower.distributed.head_pieces import pieces
from blockir.lower.distributed.projections import BranchInput, Columns, ReplicatedHeads, Rows
from blockir.lower.distributed.vocab import VocabColumns, VocabRows
from blockir.lower.layers.dense import Conv1D


@dataclass(frozen=True)
class Site:
    """One entry of the plan where its style is applied: the compiled module, the plan's axis, the stream's
    placement between blocks, and whether FSDP2 shards over data axes besides."""

    entry: ModuleStyle
    root: nn.Module
    mesh: DeviceMesh
    stream: Placement
    plan: ParallelPlan
    data_parallel: bool

    @property
    def module(self) -> nn.Module:
        return self.root.get_submodule(self.entry.path)

    @property
    def owner(self) -> nn.Module:
        """The module holding it: a projection's branch."""
        return self.root.get_submodule(self.entry.path.rpartition(".")[0])

    @property
    def sharded(self) -> bool:
        return not isinstance(self.stream, Replicate)


def _columns(site: Site) -> ParallelStyle:
    return Columns(pieces(site.owner, site.module, site.mesh.get_local_rank(), site.mesh.size()), site.entry.blocks,
                   split_bias=not site.data_parallel)


def _pair_columns(site: Site) -> ParallelStyle:
    # the first linear of a written-out MLP gathers the stream itself: no branch module does it for it; its
    # hidden units stay a DTensor split by columns, so a dropout between the pair draws global units
    return ColwiseParallel(input_layouts=site.stream, use_local_output=False)


def _rowwise(site: Site) -> ParallelStyle:
    # a replicated stream stays a plain tensor; a sharded one stays a DTensor so adds see its placement
    if isinstance(site.module, Conv1D):
        return Rows(site.stream, use_local_output=not site.sharded)
    return RowwiseParallel(output_layouts=site.stream, use_local_output=not site.sharded)


def _width_norm(site: Site) -> ParallelStyle:
    # a q/k norm over all heads, on this rank's heads: their features are a shard of the norm's width (of the key
    # width with each replicated key/value head repeated once per rank computing it)
    return PrepareModuleInputOutput(
        input_layouts=(Shard(2),), desired_input_layouts=(Shard(2),), use_local_input=False,
        output_layouts=(Shard(2),), desired_output_layouts=(Shard(2),), use_local_output=True)


def _norm(site: Site) -> ParallelStyle | None:
    # on the rank's rows where the stream is split by sequence; split by features, the norm's own path takes the
    # moments of whole rows (``numerics.meeting``), and on a replicated stream it needs nothing
    if site.plan.layout not in ("sequence", "context"):
        return None
    return SequenceParallel(sequence_dim=site.stream.dim, use_local_output=False)  # type: ignore[attr-defined]


def _embedding(site: Site) -> ParallelStyle | None:
    # a lookup on every rank's full ids, its rows then sliced to the stream's layout (no collective)
    if not site.sharded:
        return None
    return PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(site.stream,),
                               use_local_output=False)


def _head(site: Site) -> ParallelStyle | None:
    # full rows of the stream in, plain logits out: a tied table stays one plain tensor with the embedding's
    if not site.sharded:
        return None
    return PrepareModuleInput(input_layouts=(site.stream,), desired_input_layouts=(Replicate(),),
                              use_local_output=True)


def _extern(site: Site) -> ParallelStyle | None:
    # a bound module reads full rows and hands full rows back, which are cut to the stream's layout
    if not site.sharded:
        return None
    return PrepareModuleInputOutput(
        input_layouts=(site.stream,), desired_input_layouts=(Replicate(),), use_local_input=True,
        output_layouts=(Replicate(),), desired_output_layouts=(site.stream,), use_local_output=False)


STYLES: dict[str, Callable[[Site], ParallelStyle | None]] = {
    "colwise": lambda site: ColwiseParallel(),
    "columns": _columns,
    "pair_columns": _pair_columns,
    "rowwise": _rowwise,
    "width_norm": _width_norm,
    "kv_width_norm": _width_norm,
    "kv_replicated": lambda site: ReplicatedHeads(site.owner.kv_heads),
    "branch": lambda site: BranchInput(site.stream),
    "moe": lambda site: ExpertColumns(site.stream, use_local_output=not site.sharded),
    "context_moe": lambda site: ExpertRows(),
    "context_attention": lambda site: ContextAttention(site.plan.balanced),
    "vocab_embedding": lambda site: VocabRows(site.stream),
    "vocab_head": lambda site: VocabColumns(),
    "norm": _norm,
    "embedding": _embedding,
    "head": _head,
    "extern": _extern,
}
