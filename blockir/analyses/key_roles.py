"""What each checkpoint key is: a parameter, a buffer or a counter, how its tensor is laid out, and
whether it is a second name of another key's tensor.

* **role**: a learned ``parameter``; a ``buffer`` the state dict carries but no
  optimizer updates (BatchNorm's running moments); a schedule ``counter`` (the
  batches a running estimate has seen, the batch at its last calibration,
  PRepBN's transition step), which a resumed run must restore for the model to
  continue on the same schedule.
* **layout**: ``out,in`` for a projection stored as ``nn.Linear`` does,
  ``in,out`` for GPT-2's Conv1D (``conv1d=true``), ``rows`` for an embedding
  table (one row per id), ``channel`` for a per-channel vector, ``scalar`` for
  one number. A fused projection also names the order of its output rows:
  ``q;k;v`` (stacked), ``heads:q,k,v`` (per head), ``groups:q;v;k`` (CodeGen's
  row groups), ``gate;up``.
* **alias**: a ``head(tied=true)`` shares the token embedding's table, one
  tensor under two names; the compiled module stores both names and loads a
  checkpoint holding either or both (blockir/lower/layers/modules.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from blockir.norms import family
from blockir.ir.decls import KindDecl
from blockir.ir.kinds import layer_names
from blockir.ir.program import Block

COUNTERS = frozenset({"num_batches_tracked", "calibrated_at", "step"})
PROJECTIONS = ("self_attention", "cross_attention", "mlp", "gated_mlp", "moe")
_FUSED_ROWS = {"stacked": "q;k;v", "heads": "heads:q,k,v", "qvk_groups": "groups:q;v;k"}


@dataclass(frozen=True)
class KeyRole:
    role: str  # parameter | buffer | counter
    layout: str  # out,in | in,out | rows | channel | scalar
    fused: str | None = None  # the row order of a fused projection
    alias_of: str | None = None  # the key whose tensor this name shares


def _norm_role(decl: KindDecl, suffix: str, shape: tuple[int, ...]) -> KeyRole:
    buffers = {name for name, _ in family(decl).buffers(decl, ())}
    leaf = suffix.rsplit(".", 1)[-1]
    role = "counter" if suffix in buffers and leaf in COUNTERS else "buffer" if suffix in buffers else "parameter"
    return KeyRole(role, "scalar" if len(shape) == 0 or shape == (1,) else "channel")


def _projection_role(decl: KindDecl, suffix: str, shape: tuple[int, ...]) -> KeyRole:
    layer, _, leaf = suffix.rpartition(".")
    if len(shape) == 3:  # a mixture's experts, stacked: one [out, in] matrix per expert
        return KeyRole("parameter", "expert,out,in", "gate;up" if leaf == "gate_up_proj" else None)
    if leaf != "weight" or len(shape) != 2:
        fused = _fused(decl, layer)
        return KeyRole("parameter", "channel" if shape else "scalar", fused)
    conv1d = bool(decl.arg("conv1d")) and decl.kind in ("self_attention", "cross_attention", "mlp")
    return KeyRole("parameter", "in,out" if conv1d else "out,in", _fused(decl, layer))


def _fused(decl: KindDecl, layer: str) -> str | None:
    names = layer_names(decl.kind, dict(decl.args))
    if decl.kind in ("self_attention", "cross_attention") and decl.arg("fused") != "none" and layer == names["qkv"]:
        return _FUSED_ROWS[decl.arg("fused")]
    if decl.kind == "gated_mlp" and decl.arg("fused") and layer == names["gate_up"]:
        return "gate;up"
    return None


def token_table(block: Block) -> str | None:
    """The token embedding a tied head of ``block`` shares (compile ties the heads of the compiled block)."""
    return next((d.name for d in block.decls if isinstance(d, KindDecl) and d.kind == "embedding"
                 and not d.arg("positions")), None)


def head_aliases(block: Block) -> tuple[tuple[str, str], ...]:
    """``(name, second name)`` of every tensor a head of the compiled block shares: a tied head's weight is the
    token embedding's table, and a ``shared_bias`` is the vector of a ``bias`` declaration (HF's masked-LM heads
    hold ``cls.predictions.bias`` also as ``cls.predictions.decoder.bias``)."""
    table = token_table(block)
    pairs: list[tuple[str, str]] = []
    for d in block.decls:
        if isinstance(d, KindDecl) and d.kind == "head":
            if d.arg("tied") and table is not None:
                pairs.append((f"{table}.weight", f"{d.name}.weight"))
            if d.arg("shared_bias") is not None:
                pairs.append((d.arg("shared_bias"), f"{d.name}.bias"))
    return tuple(pairs)


def key_role(block: Block, decl: KindDecl, suffix: str, shape: tuple[int, ...], prefix: str,
             top: bool) -> KeyRole:
    """The role of key ``prefix + decl.name + "." + suffix``; ``top``: ``block`` is the compiled block."""
    if decl.category == "norm":
        return _norm_role(decl, suffix, shape)
    if decl.kind in PROJECTIONS:
        return _projection_role(decl, suffix, shape)
    if decl.kind == "embedding":
        return KeyRole("parameter", "rows")
    if decl.kind == "head" and top:
        source = {alias: name for name, alias in head_aliases(block)}.get(f"{decl.name}.{suffix}")
        alias = f"{prefix}{source}" if source else None
        return KeyRole("parameter", "out,in" if suffix == "weight" else "channel", alias_of=alias)
    if decl.kind in ("head", "linear") and suffix == "weight":
        return KeyRole("parameter", "out,in")
    return KeyRole("parameter", "scalar" if not shape else "channel")
