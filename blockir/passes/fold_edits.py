"""The weight side of a fold as plain data: edits applied in order to a state dict keyed by declared names.

The IR-side fold writes them without torch; :mod:`blockir.lower.fold` applies them to a module's
weights. Each edit reads its gain from the state as it stands when the edit runs, so a chain of folds
(a scale into a norm, then that norm into the linears after it) composes without the caller ordering
the arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from blockir.diagnostics import Span


@dataclass(frozen=True)
class Gain:
    """A multiplier: a constant, or a learned tensor (``offset + state[key]`` for (1 + w) storage)."""

    const: float | None = None
    key: str | None = None
    offset: int = 0


@dataclass(frozen=True)
class ScaleOutputs:
    """``g ⊙ (W x + b)``: W' = diag(g) W, b' = g ⊙ b."""

    weight: str
    bias: str | None
    gain: Gain


@dataclass(frozen=True)
class ScaleInputs:
    """``W (g ⊙ x)``: W' = W diag(g)."""

    weight: str
    gain: Gain


@dataclass(frozen=True)
class ShiftBias:
    """``W (x + c β) + b``: b' = b + c W β; runs before the same weight's ScaleInputs."""

    weight: str
    bias: str
    shift: Gain
    factor: float


@dataclass(frozen=True)
class ScaleNormState:
    """``g ⊙ (γ ⊙ x̂ + β)``: γ' = g ⊙ (offset + γ) - offset, β' = g ⊙ β."""

    weight: str
    bias: str | None
    offset: int
    gain: Gain


@dataclass(frozen=True)
class FoldStatistics:
    """A batch-coupled norm under its running moments, ``s ⊙ x + t``, into every linear reading it
    (through a constant factor c): W' = c W diag(s), b' = b + c W t. Refused while the moments do not
    describe the function: a PRepBN before its transition ends, statistics never calibrated or
    trained past since (Guo et al., arXiv:2405.11582)."""

    norm: str
    prefix: str  # where the RepBN state sits inside the norm: "bn." for PRepBN
    eps: float
    transition: int | None  # PRepBN's T
    linears: tuple[tuple[str, str, float], ...]  # (weight, bias, c)
    span: Span
    family: str  # the norm's family, whose fixed map it is


@dataclass(frozen=True)
class Drop:
    """The parameter left the program; its value now lives in other weights."""

    key: str


Edit = Union[ScaleOutputs, ScaleInputs, ShiftBias, ScaleNormState, FoldStatistics, Drop]
