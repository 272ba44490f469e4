"""Every place a block drops values, who owns the setting, and which tensor it acts on.

Three settings that act on different tensors at different points:

* **attention probabilities**: an attention declaration's ``dropout=``, on the
  softmax output inside the branch (one probability per head, query and key row), drawn from torch's
  generator by the attention kernel;
* **residual dropout**: ``dropout(…)`` on a branch update before the add
  (Vaswani et al., 2017), and its per-sample form ``drop_path`` and per-layer
  form ``layer_drop``, keyed by logical coordinates (blockir/lower/rng.py);
* **inner dropout**: any other ``dropout(…)`` of the block (on an embedding,
  an MLP's hidden values), keyed the same way.

An extern applies whatever its bound module applies; the file cannot see it,
so it is listed as an owner whose setting is unknown here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blockir.analyses.sizes import Env, value
from blockir.analyses.structure import wrapper
from blockir.diagnostics import Span
from blockir.ir.decls import ExternDecl, KindDecl
from blockir.analyses.block_queries import has
from blockir.ir.traits import Stochastic
from blockir.ops import Op
from blockir.ir.program import Block

ATTENTION = ("self_attention", "cross_attention")
RNG = {"attention_probabilities": "torch_generator", "residual": "keyed", "drop_path": "keyed",
       "layer_drop": "keyed_per_layer", "inner": "keyed", "extern": "bound_module"}


@dataclass(frozen=True)
class DropoutOwner:
    owner: str  # the declaration (attention, extern) or the value the dropout writes
    kind: str  # attention_probabilities | residual | drop_path | layer_drop | inner | extern
    p: float | int | None  # None: not evaluable here, or unknown (extern)
    acts_on: str  # the tensor it drops
    span: Span
    mask: str | None = None  # which axes one draw covers (element, row, channel, sample)
    branch: str | None = None  # the update a residual dropout belongs to

    @property
    def rng(self) -> str:
        return RNG[self.kind]

    def data(self) -> dict[str, Any]:
        p = float(self.p) if isinstance(self.p, float) else self.p
        return {"owner": self.owner, "kind": self.kind, "p": p, "acts_on": self.acts_on, "rng": self.rng,
                **({"mask": self.mask} if self.mask else {}), **({"branch": self.branch} if self.branch else {})}


def _residual_kind(op: Op) -> str:
    # one draw per layer is layer drop, one per sample drop-path
    return {"layer": "layer_drop", "sample": "drop_path"}.get(op.mask, "residual")  # type: ignore[attr-defined]


def dropout_owners(block: Block, env: Env) -> tuple[DropoutOwner, ...]:
    """The dropout owners of ``block`` in declaration order, then in op order."""
    out: list[DropoutOwner] = []
    for d in block.decls:
        if isinstance(d, KindDecl) and d.kind in ATTENTION:
            out.append(DropoutOwner(d.name, "attention_probabilities", value(d.arg("dropout"), env),
                                    f"the attention probabilities inside '{d.name}' (per head, query and key row)",
                                    d.span))
        elif isinstance(d, ExternDecl):
            out.append(DropoutOwner(d.name, "extern", None, f"whatever the module bound to '{d.name}' drops",
                                    d.span))
    on_updates = {id(op): b for s in wrapper(block).sublayers for b in s.branches for op in b.dropouts}
    for op in block.ops:
        if not has(op, Stochastic):
            continue
        b = on_updates.get(id(op))
        if b is not None:
            out.append(DropoutOwner(op.result, _residual_kind(op), value(op.p, env),
                                    f"the update of '{b.name}' before the residual add", op.span,
                                    None if op.mask == "layer" else op.mask, b.name))
        else:
            out.append(DropoutOwner(op.result, "inner", value(op.p, env), f"'{op.operand}'", op.span, op.mask))
    return tuple(out)
