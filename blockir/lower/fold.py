"""Folds applied to a compiled module: the fold pass rewrites the IR, its weight edits rewrite the state dict,
and a module compiled from the folded program takes the edited weights; DeepScaleLM's branch scale folds
the same way.

The edits (:mod:`blockir.passes.fold_edits`) are plain data written by the IR-side fold; this module
is their arithmetic. Each edit reads its gain from the state as it stands when it runs.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from blockir.analyses.sizes import block_env, program_env, value
from blockir.diagnostics import BlockError, error
from blockir.ir.consts import Name
from blockir.ir.init_roles import LAST
from blockir.ir.program import Program
from blockir.lower.bind import BoundExtern
from blockir.lower.compile import compile as compile_block
from blockir.norms import family as family_of
from blockir.norms import family_named
from blockir.passes.fold import FoldEvent, fold_pass
from blockir.passes.fold_edits import (
    Drop,
    Edit,
    FoldStatistics,
    Gain,
    ScaleInputs,
    ScaleNormState,
    ScaleOutputs,
    ShiftBias,
)
from blockir.passes.manager import run_pass
from blockir.passes.recipes.base import gained_branches
from blockir.passes.recipes.deepscalelm import BRANCH, SKIP, skip_fold, unscaled_branches, unscaled_updates

if TYPE_CHECKING:
    import torch.fx as fx
    from torch import Tensor, nn


@dataclass(frozen=True)
class FoldResult:
    program: Program
    module: fx.GraphModule | None
    report: tuple[FoldEvent, ...]

    @property
    def fired(self) -> tuple[FoldEvent, ...]:
        return tuple(e for e in self.report if e.fired)

    @property
    def refused(self) -> tuple[FoldEvent, ...]:
        return tuple(e for e in self.report if not e.fired)


def apply_folds(program: Program, block_name: str, module: fx.GraphModule | None = None, mode: str = "infer", *,
                dims: Mapping[str, int] | None = None) -> FoldResult:
    """Fold ``block_name`` of ``program``; with ``module`` (compiled from it, weights loaded), also
    return a new module compiled from the folded program holding the folded weights.

    ``module`` is left untouched; ``dims`` are the sizes it was compiled with.
    """
    folded = run_pass(program, fold_pass(block_name, mode, dims))
    new = rebuild_module(folded.program, block_name, module, list(folded.detail.edits), mode, dims) \
        if module is not None else None
    return FoldResult(folded.program, new, folded.detail.report)


def _gain(gain: Gain, state: dict[str, Tensor]) -> Tensor | float:
    if gain.key is None:
        assert gain.const is not None
        return gain.const
    return state[gain.key] + gain.offset if gain.offset else state[gain.key]


def _statistics(edit: FoldStatistics, state: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The norm under its running moments as ``scale ⊙ x + shift``."""
    at = f"{edit.norm}.{edit.prefix}"
    _check_moments(edit, state, at)
    return family_named(edit.family).fixed_map(state, at, edit.eps)


def _check_moments(edit: FoldStatistics, state: dict[str, Tensor], at: str) -> None:
    if edit.transition is not None:
        step = int(state[f"{edit.norm}.step"])
        if step < edit.transition:
            gamma = (edit.transition - step) / edit.transition
            raise BlockError([error(
                "E0751", f"prepbn '{edit.norm}' is at step {step} of its {edit.transition}-step transition "
                f"(gamma = {gamma:g}): its output still holds that share of LayerNorm, which the fold would drop",
                edit.span, hint="train until the transition ends (gamma = 0), then calibrate, then fold")])
    tracked, calibrated = int(state[at + "num_batches_tracked"]), int(state[at + "calibrated_at"])
    if calibrated != tracked:
        when = "never calibrated" if calibrated < 0 else \
            f"trained {tracked - calibrated} batches past their calibration"
        raise BlockError([error(
            "E0752", f"the running moments of '{edit.norm}' are {when}: folding would freeze statistics that "
            "do not describe the current parameters", edit.span,
            hint="run blockir calibrate (or blockir.calibrate) on representative data first")])


def _rows(g: Tensor | float) -> Tensor | float:
    # a per-channel gain scales the rows of a [out, in] weight
    return g.unsqueeze(-1) if not isinstance(g, (int, float)) and g.dim() == 1 else g


def _drop(state: dict[str, Tensor], edit: Drop) -> None:
    del state[edit.key]


def _fold_statistics(state: dict[str, Tensor], edit: FoldStatistics) -> None:
    scale, shift = _statistics(edit, state)
    for w, b, c in edit.linears:
        state[b] = state[b] + c * (state[w] @ shift)
    for w in dict.fromkeys(w for w, _, _ in edit.linears):
        c = next(c for w2, _, c in edit.linears if w2 == w)
        state[w] = state[w] * (c * scale)


def _shift_bias(state: dict[str, Tensor], edit: ShiftBias) -> None:
    state[edit.bias] = state[edit.bias] + edit.factor * (state[edit.weight] @ _gain(edit.shift, state))


def _scale_outputs(state: dict[str, Tensor], edit: ScaleOutputs) -> None:
    g = _gain(edit.gain, state)
    state[edit.weight] = _rows(g) * state[edit.weight]
    if edit.bias is not None:
        state[edit.bias] = g * state[edit.bias]


def _scale_inputs(state: dict[str, Tensor], edit: ScaleInputs) -> None:
    state[edit.weight] = state[edit.weight] * _gain(edit.gain, state)


def _scale_norm_state(state: dict[str, Tensor], edit: ScaleNormState) -> None:
    g = _gain(edit.gain, state)
    state[edit.weight] = g * (state[edit.weight] + edit.offset) - edit.offset
    if edit.bias is not None:
        state[edit.bias] = g * state[edit.bias]


APPLY: dict[type, Callable[[dict[str, Any], Any], None]] = {
    Drop: _drop, FoldStatistics: _fold_statistics, ShiftBias: _shift_bias, ScaleOutputs: _scale_outputs,
    ScaleInputs: _scale_inputs, ScaleNormState: _scale_norm_state}


def apply_edits(state: dict[str, Tensor], edits: list[Edit]) -> dict[str, Tensor]:
    """A new state dict with ``edits`` applied in order; ``state`` is left as it was."""
    out = {k: v.detach().clone() for k, v in state.items()}
    with torch.no_grad():
        for edit in edits:
            APPLY[type(edit)](out, edit)
    return out


def _bindings(module: nn.Module) -> dict[str, Any]:
    """Copies of the module's bound externs, keyed by path, so the rebuild owns its own."""
    return {path: (copy.deepcopy(m.bound), m.adapter) for path, m in module.named_modules()
            if isinstance(m, BoundExtern)}


def rebuild_module(program: Program, name: str, module: nn.Module, edits: list[Edit], mode: str,
                   dims: Mapping[str, int] | None) -> fx.GraphModule:
    """Compile the folded program and load ``module``'s weights with ``edits`` applied, strictly."""
    first = next((p for p in module.parameters() if p.is_floating_point()), None)
    dtype = first.dtype if first is not None else None
    device = first.device if first is not None else None
    new = compile_block(program, name, dims=dims, bind=_bindings(module), dtype=dtype, device=device, mode=mode)
    new.load_state_dict(apply_edits(module.state_dict(), edits), strict=True)
    return new.train(module.training)


def fold_deepscalelm(program: Program, block_name: str, module: nn.Module) -> tuple[Program, dict[str, Tensor]]:
    """The program without DeepScaleLM's scales that fold, and ``module``'s state dict with them folded.

    ``program`` is the recipe's output and ``module`` compiled from it. beta (the block's ``branch_scale``) goes
    into each branch's last linear (``W' = beta W``, ``b' = beta b``). On a Post-LN block compiled inside a
    model that stacks it, lambda (``skip_scale``) folds too (:class:`~blockir.passes.recipes.deepscalelm.SkipFold`):
    every post norm's gain and shift but the stack's last times lambda, the stream-reading linears of every
    branch divided by lambda, and the model's stack input times lambda; otherwise lambda stays on the shortcut.
    """
    block = program.block(block_name)
    env = block_env(program_env(program), block)
    beta, lam = value(Name(BRANCH), env), value(Name(SKIP), env)
    decls = {d.name: d.kind for d in gained_branches(block, "DeepScaleLM")}
    plan = skip_fold(program, block_name)
    folds_skip = plan.reason is None and getattr(module, "blockir_block", None) in plan.models
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    norms = []
    for path, sub in module.named_modules():
        leaf = path.rpartition(".")[2]
        kind = decls.get(leaf)
        if kind is not None and hasattr(sub, "names"):
            _scale_keys(state, f"{path}.{sub.names[LAST[kind]]}", beta)
            for layer in plan.first_linears.get(leaf, ()) if folds_skip else ():
                state[f"{path}.{layer}.weight"] = state[f"{path}.{layer}.weight"] / lam
        if folds_skip and leaf in plan.norms:
            norms.append((path, block.decl_map[leaf]))
    if folds_skip:
        # each stack's output, its last norm's, is read unscaled after it: paths are stack.layer.norm
        last = {path.rsplit(".", 2)[0]: path for path, _ in norms}
        for path, decl in norms:
            if path not in last.values():
                _scale_norm_state(state, path, decl, lam)
        return unscaled_updates(program, block_name), state
    return unscaled_branches(program, block_name), state


def _scale_keys(state: dict[str, Tensor], layer: str, factor: float) -> None:
    for key in (f"{layer}.weight", f"{layer}.bias"):
        if key in state:
            state[key] = state[key] * factor


def _scale_norm_state(state: dict[str, Tensor], path: str, decl: Any, factor: float) -> None:
    """``factor * norm(x)`` as the norm's own affine state: the gain (``(1 + w)`` with ``offset=1``) and shift."""
    fam, offset = family_of(decl), decl.arg("offset", 0) or 0
    for i, key in enumerate(fam.affine_keys(decl)):
        k = f"{path}.{key}"
        shift = offset if i == 0 and fam.weight(decl) else 0
        state[k] = factor * (state[k] + shift) - shift
