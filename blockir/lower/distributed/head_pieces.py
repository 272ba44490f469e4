"""Which stored output features of a fused projection a rank computes: its heads' q, k and v columns of a
stacked matrix, its units' gate and up columns, its heads' rows of q/v/k row groups (CodeGen's), else one
contiguous block; and the branch's head counts on the rank once its matrix is split."""
from __future__ import annotations

from torch import nn

from blockir.analyses.parallel import ParallelPlan
from blockir.lower.layers.dense import Conv1D


def pieces(branch: nn.Module, proj: nn.Module, rank: int, world: int) -> list[tuple[int, int]]:
    """The ranges of ``proj``'s stored output features rank ``rank`` of ``world`` computes: its heads' q, k
    and v columns of a stacked matrix (one key/value head where they are replicated), its units' gate and up
    columns of a stacked gate/up matrix, its heads' q, v and k columns of q/v/k row groups the degree does not
    divide, else one contiguous block (per head q, k, v in turn is one too, and so are whole row groups)."""
    size = proj.weight.shape[1 if isinstance(proj, Conv1D) else 0]
    share = lambda n, unit=1: (rank * n // world * unit, (rank + 1) * n // world * unit)  # noqa: E731
    fused = vars(branch).get("fused")
    if fused == "qvk_groups" and branch.qkv_groups % world:
        return group_pieces(branch, *share(branch.heads))
    if fused == "stacked":
        hd, heads, kv = branch.head_dim, branch.heads, branch.kv_heads
        k0, k1 = share(kv, hd) if kv % world == 0 else ((rank * kv // world) * hd, (rank * kv // world + 1) * hd)
        q_out, kv_out = heads * hd, kv * hd
        return [share(heads, hd), (q_out + k0, q_out + k1), (q_out + kv_out + k0, q_out + kv_out + k1)]
    if fused is True:  # gate rows, then up rows
        a, b = share(size // 2)
        return [(a, b), (size // 2 + a, size // 2 + b)]
    return [share(size)]


def group_pieces(branch: nn.Module, first: int, stop: int) -> list[tuple[int, int]]:
    """The rows of heads ``first``…``stop`` of q/v/k row groups (CodeGen's) where a rank's heads are part of
    one group or span several: all their q rows (one range per group they meet), then their v rows, then their
    k rows, so that the rank's columns are one row group [q; v; k] of its own heads (``local_heads`` sets one
    group)."""
    hd, per = branch.head_dim, branch.heads // branch.qkv_groups  # per: the heads of one group
    runs = [(g, max(first, g * per) - g * per, min(stop, (g + 1) * per) - g * per)
            for g in range(first // per, (stop - 1) // per + 1)]
    return [((3 * g + part) * per * hd + a * hd, (3 * g + part) * per * hd + b * hd)
            for part in range(3) for g, a, b in runs]


def local_heads(module: nn.Module, plan: ParallelPlan, world: int) -> None:
    """A stacked q/k/v matrix, or q/v/k row groups, is split by the branch's own head (and group) counts: they
    become this rank's. Whole row groups stay groups; a rank's part of one group, or its heads across several,
    is one group of its own heads (``group_pieces``)."""
    for m in plan.modules:
        branch = module.get_submodule(m.path.rpartition(".")[0])
        fused = vars(branch).get("fused") if m.style == "columns" else None
        if fused == "stacked":
            kv = branch.kv_heads
            vars(branch).update(heads=branch.heads // world, kv_heads=kv // world if kv % world == 0 else 1)
        elif fused == "qvk_groups":
            groups = branch.qkv_groups
            vars(branch).update(heads=branch.heads // world, kv_heads=branch.kv_heads // world,
                                qkv_groups=groups // world if groups % world == 0 else 1)
