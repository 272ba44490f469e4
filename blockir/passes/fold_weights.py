"""The weight side of a fold: edits applied in order to a state dict keyed by declared names.

Each edit reads its gain from the state as it stands when the edit runs, so a
chain of folds (a scale into a norm, then that norm into the linears after it)
composes without the caller ordering the arithmetic.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Union

from blockir.diagnostics import Span
from blockir.ir.program import Program
from blockir.norms import family_named

if TYPE_CHECKING:
    # the edits themselves are plain data, built by the IR-side fold without torch
    import torch.fx as fx
    from torch import Tensor, nn


@dataclass(frozen=True)
class Gain:
    """A multiplier: a constant, or a learned tensor (``offset + state[key]`` for (1 + w) storage)."""

    const: float | None = None
    key: str | None = None
    offset: int = 0

    def value(self, state: dict[str, Tensor]) -> Tensor | float:
        if self.key is None:
            assert self.const is not None
            return self.const
        return state[self.key] + self.offset if self.offset else state[self.key]


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

    def map(self, state: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        at = f"{self.norm}.{self.prefix}"
        self._legal(state, at)
        return family_named(self.family).fixed_map(state, at, self.eps)

    def _legal(self, state: dict[str, Tensor], at: str) -> None:
        from blockir.diagnostics import BlockError, error
        if self.transition is not None:
            step = int(state[f"{self.norm}.step"])
            if step < self.transition:
                gamma = (self.transition - step) / self.transition
                raise BlockError([error(
                    "E0751", f"prepbn '{self.norm}' is at step {step} of its {self.transition}-step transition "
                    f"(gamma = {gamma:g}): its output still holds that share of LayerNorm, which the fold would drop",
                    self.span, hint="train until the transition ends (gamma = 0), then calibrate, then fold")])
        tracked, calibrated = int(state[at + "num_batches_tracked"]), int(state[at + "calibrated_at"])
        if calibrated != tracked:
            when = "never calibrated" if calibrated < 0 else \
                f"trained {tracked - calibrated} batches past their calibration"
            raise BlockError([error(
                "E0752", f"the running moments of '{self.norm}' are {when}: folding would freeze statistics that "
                "do not describe the current parameters", self.span,
                hint="run blockir calibrate (or blockir.calibrate) on representative data first")])


@dataclass(frozen=True)
class Drop:
    """The parameter left the program; its value now lives in other weights."""

    key: str


Edit = Union[ScaleOutputs, ScaleInputs, ShiftBias, ScaleNormState, FoldStatistics, Drop]


def _rows(g: Tensor | float) -> Tensor | float:
    # a per-channel gain scales the rows of a [out, in] weight
    return g.unsqueeze(-1) if not isinstance(g, (int, float)) and g.dim() == 1 else g


def _apply(state: dict[str, Tensor], edit: Edit) -> None:
    if isinstance(edit, Drop):
        del state[edit.key]
        return
    if isinstance(edit, FoldStatistics):
        scale, shift = edit.map(state)
        for w, b, c in edit.linears:
            state[b] = state[b] + c * (state[w] @ shift)
        for w in dict.fromkeys(w for w, _, _ in edit.linears):
            c = next(c for w2, _, c in edit.linears if w2 == w)
            state[w] = state[w] * (c * scale)
        return
    if isinstance(edit, ShiftBias):
        shift = edit.shift.value(state)
        state[edit.bias] = state[edit.bias] + edit.factor * (state[edit.weight] @ shift)
        return
    g = edit.gain.value(state)
    if isinstance(edit, ScaleOutputs):
        state[edit.weight] = _rows(g) * state[edit.weight]
        if edit.bias is not None:
            state[edit.bias] = g * state[edit.bias]
    elif isinstance(edit, ScaleInputs):
        state[edit.weight] = state[edit.weight] * g
    else:
        state[edit.weight] = g * (state[edit.weight] + edit.offset) - edit.offset
        if edit.bias is not None:
            state[edit.bias] = g * state[edit.bias]


def apply_edits(state: dict[str, Tensor], edits: list[Edit]) -> dict[str, Tensor]:
    """A new state dict with ``edits`` applied in order; ``state`` is left as it was."""
    import torch
    out = {k: v.detach().clone() for k, v in state.items()}
    with torch.no_grad():
        for edit in edits:
            _apply(out, edit)
    return out


def _bindings(module: nn.Module) -> dict[str, Any]:
    """Copies of the module's bound externs, keyed by path, so the rebuild owns its own."""
    from blockir.lower.bind import BoundExtern
    return {path: (copy.deepcopy(m.bound), m.adapter) for path, m in module.named_modules()
            if isinstance(m, BoundExtern)}


def rebuild_module(program: Program, name: str, module: nn.Module, edits: list[Edit], mode: str,
                   dims: Mapping[str, int] | None) -> fx.GraphModule:
    """Compile the folded program and load ``module``'s weights with ``edits`` applied, strictly."""
    from blockir.lower.compile import compile as compile_block
    first = next((p for p in module.parameters() if p.is_floating_point()), None)
    dtype = first.dtype if first is not None else None
    device = first.device if first is not None else None
    new = compile_block(program, name, dims=dims, bind=_bindings(module), dtype=dtype, device=device, mode=mode)
    new.load_state_dict(apply_edits(module.state_dict(), edits), strict=True)
    return new.train(module.training)
