"""The pass manager: every rewrite runs through it, and a pass whose program does not verify is named (E0707)."""
from __future__ import annotations

import pytest

import blockir
from blockir.diagnostics import BlockError
from blockir.ir.program import Program
from blockir.passes.fold import fold_pass
from blockir.passes.fuse import FUSE
from blockir.passes.inline import inline_pass
from blockir.passes.manager import Pass, PassResult, program_pass, run_pass, run_passes
from blockir.passes.recipes import RECIPES, layerscale
from blockir.passes.recipes.base import drop_final_norms, replace_blocks
from blockir.analyses.sizes import Sizes
from conftest import ROOT

LLAMA = ROOT / "examples" / "llama.block"
# what the verifiers say of llama.block without its final norm
NO_FINAL_NORM = ("E0403", f"{LLAMA}:37:3")


def _without_final_norm(program: Program) -> PassResult[None]:
    models, _ = drop_final_norms(program, "LlamaDecoderLayer")
    return PassResult(replace_blocks(program, models), True, None)


def test_a_pass_that_breaks_verification_is_named_where_it_broke() -> None:
    program = blockir.load(LLAMA)
    with pytest.raises(BlockError) as info:
        run_passes(program, [FUSE, Pass("strip", _without_final_norm)])
    first, *rest = info.value.diagnostics
    assert (first.code, str(first.span), first.message) == (
        "E0707", NO_FINAL_NORM[1], "the 'strip' pass produced a program that does not verify")
    assert first.hint == "this is a bug in blockir: please report it with the file"
    assert [(d.code, str(d.span)) for d in rest] == [NO_FINAL_NORM]


def test_an_unchanged_result_is_not_verified_again() -> None:
    program = blockir.load(LLAMA)
    broken = _without_final_norm(program).program
    assert run_pass(program, Pass("claims no change", lambda p: PassResult(broken, False, None))).program is broken


def test_passes_run_in_order_on_each_others_output() -> None:
    program = blockir.load(LLAMA)
    sizes = Sizes.of(program)
    fused = run_passes(program, [inline_pass("LlamaModel", sizes), FUSE])
    ops = [op.text() for op in fused.block("LlamaModel").ops if "fused_add_norm" in op.text()]
    # two boundaries per layer, the last one closing on the model's final norm
    assert len(ops) == 2 * 2
    assert ops[-1] == "%1, layers.1.y = fused_add_norm[norm](branch=layers.1.%3, shortcut=layers.1.h)"
    # fusing first leaves each layer its own block: the layer has one boundary inside it, the model none
    apart = run_passes(program, [FUSE, inline_pass("LlamaModel", sizes)])
    assert sum("fused_add_norm" in op.text() for op in apart.block("LlamaModel").ops) == 2


def test_a_recipe_is_verified_as_a_named_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recipe's output is checked by the manager, not by the recipe: a rewrite that loses the final norm
    is reported under the recipe's name."""
    program = blockir.load(LLAMA)
    monkeypatch.setattr(layerscale, "finish", lambda p: _without_final_norm(p).program)
    with pytest.raises(BlockError) as info:
        RECIPES["layerscale"](program, "LlamaDecoderLayer")
    assert [d.code for d in info.value.diagnostics] == ["E0707", "E0403"]
    assert info.value.diagnostics[0].message == "the 'layerscale' pass produced a program that does not verify"


def test_the_fold_pass_reports_its_edits_beside_the_program() -> None:
    program = blockir.load(ROOT / "examples" / "layerscale.block")
    result = run_pass(program, fold_pass("LayerScaleBlock"))
    assert result.changed == any(e.fired for e in result.detail.report)
    assert [(e.rule, e.site.name) for e in result.detail.report if e.fired] == [
        ("dropout", "drop_path(%2)"), ("dropout", "drop_path(%6)"), ("scale-into-linear", "ls1.gamma"),
        ("scale-into-linear", "ls2.gamma"), ("affine-into-linears", "norm1"), ("affine-into-linears", "norm2")]
    # each gain goes into its branch's output rows, then leaves the program
    assert [(type(e).__name__, getattr(e, "weight", getattr(e, "key", None))) for e in result.detail.edits[:4]] == [
        ("ScaleOutputs", "attn.o_proj.weight"), ("Drop", "ls1.gamma"),
        ("ScaleOutputs", "mlp.fc2.weight"), ("Drop", "ls2.gamma")]
    assert run_pass(program, fold_pass("LayerScaleBlock", "train")).changed is False


def test_program_pass_wraps_a_plain_rewrite() -> None:
    program = blockir.load(LLAMA)
    result = run_pass(program, program_pass("identity", lambda p: (p, False)))
    assert result == PassResult(program, False, None)
