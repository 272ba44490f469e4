"""Declared facts: block constants with reserved names that state what the graph must be.

The grammar has no annotations beyond ``@inplace``, so a block states a fact
about itself with a constant of a reserved name (value 0 or 1), much as a
framework config carries ``norm_first`` or ``use_parallel_residual``. The
verifiers check the graph against every stated fact:

``norm_first``         1: every branch reads a normalized state (Pre-LN family);
                       0: every residual sum is normalized (Post-LN family).
``parallel_residual``  1: all branches read the same state and join one add;
                       0: branches update the state one after another.
``final_norm``         (models) 1: the stack must end with a norm;
                       0: it deliberately does not (the output head owns it).
``residual_from_norm`` 1: an update deliberately continues the stream from a
                       normalized value (its shortcut is a norm's output and
                       its own sum is not normalized), as some released models
                       do; unstated, that wiring is an error.
``normformer``         1: the block is a NormFormer layer pair (arXiv:2110.09456):
                       Pre-LN, per-head attention scales, a norm on the
                       attention output and a norm inside the FFN.
``fixup``              1: the block follows Fixup (arXiv:1901.09321): no norm,
                       a scalar multiplier and scalar biases on every branch.
``deepscalelm``        1: every update is ``lambda * x + beta * F(x)`` with
                       lambda^2 + beta^2 = 1 (arXiv:2403.09635).
``tfixup``             1: the block follows T-Fixup (Huang et al., 2020): no
                       norm, and every built-in branch initialised with the
                       gain of its side (0.67 N^(-1/4) encoder, (9N)^(-1/4)
                       decoder) for the stack's N layers.
``scaled_shortcut``    1: the block scales its shortcut by a constant on purpose
                       (a recipe other than DeepNorm or DeepScaleLM); unstated,
                       such a constant is a warning.
``training``           1: the block is trained (an ``@inplace`` add must also
                       be legal in training); 0: it is only evaluated (no
                       dropout may remain active).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from blockir.analyses.sizes import value
from blockir.ir.program import Block, Const

FACTS = ("norm_first", "parallel_residual", "final_norm", "residual_from_norm", "training", "normformer", "fixup",
         "deepscalelm", "tfixup", "scaled_shortcut")


@dataclass(frozen=True)
class Fact:
    name: str
    value: float | int | None  # None when the expression does not evaluate
    const: Const

    @property
    def valid(self) -> bool:
        return self.value in (0, 1)


def stated(block: Block, env: Mapping[str, float | int]) -> dict[str, Fact]:
    """The facts ``block`` states, by name."""
    return {c.name: Fact(c.name, value(c.value, env), c) for c in block.consts if c.name in FACTS}
