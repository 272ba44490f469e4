"""What the residual-update ledger counts in (docs/cost.md): sizes at concrete dims, the tallies that
sum over sub-blocks and multiply over stacks, and :class:`FusedBoundary`, the one count of a fused
add+norm call (the same count ``benchmarks/fused_norm.py`` uses).

Every op reads each operand once and writes each result once at its dtype (a "perfect kernel").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from blockir.norms import FAMILIES, family
from blockir.analyses.sizes import Env
from blockir.analyses.shortcut_weights import StackWeights
from blockir.ir.decls import KindDecl
from blockir.ir.types import DType, TensorType
from blockir.reports.model_size import ModelSize

STATS_ITEMSIZE = 4  # row statistics are fp32 unless a norm declares another accumulation dtype

# row reductions per norm application: (forward, backward). LayerNorm reduces the mean and the
# variance forward and sum(g*w) and sum(g*w*xhat) backward; RMSNorm and ScaleNorm one square sum
# forward and sum(g*w*xhat) backward; DyT is elementwise. Row statistics saved for backward: mean and
# rstd, rstd, the row norm, none. Both come from the norm-family table.
REDUCTIONS = {name: f.reductions for name, f in FAMILIES.items()}
STATS = {name: f.statistics for name, f in FAMILIES.items()}


class CostError(Exception):
    """The ledger cannot be computed at these sizes (a dim without a size, an unknown block)."""


def size(name: str, env: Env) -> int:
    if name not in env:
        raise CostError(f"dim '{name}' has no size; give it, e.g. --dims {name}=…")
    return int(env[name])


def elements(t: TensorType, env: Env) -> int:
    n = 1
    for axis in t.axes:
        n *= size(axis.name, env)
    return n


def itemsize(t: TensorType, default: DType) -> int:
    return (t.dtype or default).itemsize


def nbytes(t: TensorType, env: Env, default: DType) -> int:
    return elements(t, env) * itemsize(t, default)


def rows(t: TensorType, env: Env) -> int:
    return elements(t, env) // size(t.axes[-1].name, env) if t.axes else 1


def norm_parameters(decl: KindDecl, env: Env) -> int:
    """Parameter elements of one norm declaration: LayerNorm 2D (D without bias, 0 without affine),
    RMSNorm D, ScaleNorm 1, DyT 2D + 1."""
    return family(decl).parameters(decl, size(decl.arg("axes")[-1], env))


@dataclass(frozen=True)
class FusedBoundary:
    """One fused add+norm call as a perfect kernel sees it: each operand read once, each result written once.

    ``itemsize`` is the branch's (and of a learned branch scale); the residual, its norm's parameters
    and residual_out use ``residual_itemsize``; ``normalized`` uses ``output_itemsize``.
    """

    family: str  # layernorm | rmsnorm
    rows: int
    width: int
    itemsize: int
    residual_itemsize: int
    output_itemsize: int
    weight: bool = True
    bias: bool = False
    scale_elements: int = 0  # a learned branch scale: 1 (ReZero) or width (LayerScale)

    @property
    def stats_bytes(self) -> int:
        return STATS[self.family] * self.rows * STATS_ITEMSIZE

    @property
    def branch_bytes(self) -> int:
        return self.rows * self.width * self.itemsize

    @property
    def residual_bytes(self) -> int:
        return self.rows * self.width * self.residual_itemsize

    @property
    def output_bytes(self) -> int:
        return self.rows * self.width * self.output_itemsize

    @property
    def param_bytes(self) -> int:
        return (self.weight + self.bias) * self.width * self.residual_itemsize

    @property
    def scale_bytes(self) -> int:
        return self.scale_elements * self.itemsize

    def forward_bytes(self) -> int:
        """Reads branch, residual and parameters; writes normalized, residual_out and the row statistics."""
        reads = self.branch_bytes + self.residual_bytes + self.param_bytes + self.scale_bytes
        return reads + self.output_bytes + self.residual_bytes + self.stats_bytes

    def backward_bytes(self) -> int:
        """Reads both output gradients, residual_out, the statistics and the weight (and, with a learned
        scale, the saved branch and the scale); writes d_branch, d_residual and the parameter gradients."""
        reads = self.output_bytes + 2 * self.residual_bytes + self.stats_bytes
        reads += self.weight * self.width * self.residual_itemsize
        if self.scale_elements:
            reads += self.branch_bytes + self.scale_bytes
        return reads + self.branch_bytes + self.residual_bytes + self.param_bytes + self.scale_bytes

    def saved_bytes(self) -> int:
        """residual_out and the fp32 statistics, plus the branch when a learned scale needs its gradient."""
        return self.residual_bytes + self.stats_bytes + (self.branch_bytes if self.scale_elements else 0)


def fused_boundary_bytes(family: str, rows: int, width: int, itemsize: int, backward: bool = False) -> int:
    """Bytes one fused boundary moves with every tensor in one dtype and the family's affine parameters
    (weight and bias for LayerNorm, weight for RMSNorm); forward, or forward plus backward."""
    b = FusedBoundary(family, rows, width, itemsize, itemsize, itemsize, bias=FAMILIES[family].fused_code == "layer")
    return b.forward_bytes() + (b.backward_bytes() if backward else 0)


@dataclass(frozen=True)
class Tally:
    """The additive quantities of one graph: they sum over sub-blocks and multiply over stacks."""

    adds: int = 0
    norm_params: Mapping[str, int] = field(default_factory=dict)  # by norm family
    reductions_forward: int = 0  # row reductions over all rows
    reductions_backward: int = 0
    bytes_moved: int = 0
    saved_bytes: int = 0

    def __add__(self, other: Tally) -> Tally:
        params = dict(self.norm_params)
        for family, n in other.norm_params.items():
            params[family] = params.get(family, 0) + n
        return Tally(self.adds + other.adds, params, self.reductions_forward + other.reductions_forward,
                     self.reductions_backward + other.reductions_backward, self.bytes_moved + other.bytes_moved,
                     self.saved_bytes + other.saved_bytes)

    def __sub__(self, other: Tally) -> Tally:
        return self + other * -1

    def __mul__(self, n: int) -> Tally:
        """``n`` instances of this graph (a stack of n identical layers)."""
        return Tally(self.adds * n, {k: v * n for k, v in self.norm_params.items()}, self.reductions_forward * n,
                     self.reductions_backward * n, self.bytes_moved * n, self.saved_bytes * n)

    @property
    def norm_parameters(self) -> int:
        return sum(self.norm_params.values())


@dataclass(frozen=True)
class BlockCost:
    """One block: its state, one instance's tallies (unfused and fused graph) and how often it occurs."""

    name: str
    instances: int
    state: str  # the state's type, e.g. "[B, S, D] bf16"
    residual_elements: int
    residual_itemsize: int
    rows: int
    unfused: Tally
    fused: Tally
    carried_bytes: int = 0  # the carried streams one instance returns beside its state (scores: [B, H, S, S])

    @property
    def bytes_per_tensor(self) -> int:
        return self.residual_elements * self.residual_itemsize


@dataclass(frozen=True)
class Ledger:
    filename: str
    root: str
    dims: Mapping[str, int]  # the sizes of the root's state axes
    dtype: DType
    blocks: tuple[BlockCost, ...]  # every block reached, innermost first; the root (the whole model) last
    size: ModelSize | None = None  # parameters and forward matmul FLOPs of the whole root
    depth: tuple[StackWeights, ...] = ()  # the cumulative shortcut weights of the root's stacks

    @property
    def total(self) -> BlockCost:
        return self.blocks[-1]

