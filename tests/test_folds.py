"""Fold transforms: each fold keeps the function (float64, random weights, eval mode), removes the
folded state, and leaves alone, with the legality reason, every site it may not fold."""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch
from torch import nn

import blockir
from blockir.cli import main
from blockir.ops import DropoutOp, ScaleOp
from blockir.ir.printer import format_program
from blockir.ir.program import Program
from blockir.lower.fold import FoldResult, apply_folds
from conftest import ROOT

HEAD = """dim B: batch
dim S: seq
dim D: model = 64
dim F: hidden = 128
dim H: heads = 4
"""
TOLERANCE = 1e-10


def _example(stem: str, *replacements: tuple[str, str]) -> Program:
    text = (ROOT / "examples" / f"{stem}.block").read_text()
    for old, new in replacements:
        assert old in text
        text = text.replace(old, new)
    return blockir.parse(text)


def _randomize(module: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for value in module.state_dict().values():
            value.copy_(0.5 * torch.randn(value.shape, generator=g, dtype=value.dtype) + 0.3)


def _fold(program: Program, name: str, bind: dict | None = None, seed: int = 0) -> tuple[FoldResult, float]:
    """Fold with weights; check the input module is untouched and the folded program is clean."""
    module = blockir.compile(program, name, dtype=torch.float64, seed=seed, bind=bind).eval()
    _randomize(module, seed)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    result = apply_folds(program, name, module)
    x = torch.randn(2, 7, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        expected, actual = module(x), result.module.eval()(x)
    assert before.keys() == module.state_dict().keys()
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert result.module is not module
    assert not [d for d in blockir.verify(result.program) if d.is_error]
    assert blockir.parse(format_program(result.program)) == result.program
    return result, ((actual - expected).norm() / expected.norm()).item()


def _lost(program: Program, name: str, result: FoldResult, bind: dict | None = None) -> set[str]:
    return set(blockir.compile(program, name, bind=bind).state_dict()) - set(result.module.state_dict())


def _rules(result: FoldResult) -> list[tuple[str, str | None]]:
    return [(e.site.name, e.rule) for e in result.fired]


def _codes(result: FoldResult) -> dict[str, tuple[str | None, str | None]]:
    return {e.site.name: (e.code, e.reason) for e in result.refused}


def test_layerscale_gains_norm_affines_and_drop_paths_fold_away() -> None:
    # f64 statistics: with the default f32 ones the unfolded affine itself rounds at 1e-7
    program = _example("layerscale", ("layernorm(D, eps=1e-6)", "layernorm(D, eps=1e-6, accum=f64)"))
    result, err = _fold(program, "LayerScaleBlock")
    assert err < TOLERANCE
    assert _rules(result) == [("drop_path(%2)", "dropout"), ("drop_path(%6)", "dropout"),
                              ("ls1.gamma", "scale-into-linear"), ("ls2.gamma", "scale-into-linear"),
                              ("norm1", "affine-into-linears"), ("norm2", "affine-into-linears")]
    assert not result.refused
    assert _lost(program, "LayerScaleBlock", result) == {
        "ls1.gamma", "ls2.gamma", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}
    block = result.program.block("LayerScaleBlock")
    assert not [op for op in block.ops if isinstance(op, (ScaleOp, DropoutOp))]
    assert block.decl_map["norm1"].arg("affine") is False


def test_rezero_scalar_shared_by_two_branches_folds_into_both() -> None:
    program = _example("rezero")
    result, err = _fold(program, "ReZeroLayer")
    assert err < TOLERANCE
    assert [rule for _, rule in _rules(result)] == ["dropout", "dropout", "scale-into-linear", "scale-into-linear"]
    assert _lost(program, "ReZeroLayer", result) == {"resweight"}
    assert "resweight" not in result.program.block("ReZeroLayer").decl_map


def test_constant_scales_fold_into_the_producer_and_into_the_consumers() -> None:
    program = blockir.parse(HEAD + """block C(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D, accum=f64)
  mlp: mlp(F)
  up: linear(D, F)
  down: linear(F, D)
  h = x + 0.25 * mlp(n(x))
  y = h + down(0.5 * gelu(up(h)))
  return y
}
""")
    result, err = _fold(program, "C")
    assert err < TOLERANCE
    assert _rules(result) == [("0.25 * %1", "scale-into-linear"), ("0.5 * %4", "scale-into-consumers"),
                              ("n", "affine-into-linears")]
    assert not [op for op in result.program.block("C").ops if isinstance(op, ScaleOp)]
    assert _lost(program, "C", result) == {"n.weight", "n.bias"}


def test_a_scale_folds_into_its_norm_which_then_folds_into_q_k_v() -> None:
    program = blockir.parse(HEAD + """block Q(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D, accum=f64)
  attn: self_attention(heads=H, bias=true, out_bias=true)
  y = x + attn(-0.75 * n(x))
  return y
}
""")
    result, err = _fold(program, "Q")
    assert err < TOLERANCE
    assert [rule for _, rule in _rules(result)] == ["scale-into-norm", "affine-into-linears"]
    assert _lost(program, "Q", result) == {"n.weight", "n.bias"}


def test_rmsnorm_weights_fold_into_attention_and_gated_mlp() -> None:
    program = _example("llama")
    result, err = _fold(program, "LlamaDecoderLayer")
    assert err < TOLERANCE
    assert _rules(result) == [("input_layernorm", "affine-into-linears"),
                              ("post_attention_layernorm", "affine-into-linears")]
    assert _lost(program, "LlamaDecoderLayer", result) == {"input_layernorm.weight", "post_attention_layernorm.weight"}
    norm = result.program.block("LlamaDecoderLayer").decl_map["input_layernorm"]
    assert (norm.kind, norm.arg("affine")) == ("rmsnorm", False)


@pytest.mark.parametrize("branch, rules", [("proj(n(x))", ["affine-into-linears"]),
                                           ("proj(0.5 * n(x))", ["scale-into-norm", "affine-into-linears"])])
def test_gemma_offset_weight_folds_as_one_plus_w(branch: str, rules: list[str]) -> None:
    program = blockir.parse(HEAD + f"""block G(x: [B, S, D]) -> [B, S, D] {{
  n: rmsnorm(D, offset=1, cast=after_weight, accum=f64)
  proj: linear(D, D)
  y = x + {branch}
  return y
}}
""")
    result, err = _fold(program, "G")
    assert err < TOLERANCE
    assert [rule for _, rule in _rules(result)] == rules
    assert _lost(program, "G", result) == {"n.weight"}
    assert result.program.block("G").decl_map["n"].arg("offset") == 0


def test_deepnorm_shortcut_scale_and_post_norms_are_kept_with_their_reasons() -> None:
    program = _example("deepnorm")
    result, err = _fold(program, "DeepNormLayer")
    assert err == 0.0 and not result.fired and result.program == program
    codes = _codes(result)
    assert codes["alpha * x"] == ("shortcut", "it scales the shortcut 'x', which also feeds the branch 'self_attn': "
                                  "folding it upstream would scale both paths")
    assert codes["ln_1"][0] == "not_linear" and "residual add" in codes["ln_1"][1]
    assert codes["ln_2"][0] == "not_linear"


def test_training_mode_folds_nothing() -> None:
    program = _example("layerscale")
    result = apply_folds(program, "LayerScaleBlock", mode="train")
    assert result.program == program and not result.fired and result.module is None
    assert {e.code for e in result.refused} == {"training"}
    assert len(result.refused) == 6


def test_tied_norm_is_kept() -> None:
    program = blockir.parse(HEAD + """block T(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D, tied=true, accum=f64)
  attn: self_attention(heads=H, bias=true)
  mlp: mlp(F)
  h = x + attn(n(x))
  y = h + mlp(n(h))
  return y
}
""")
    result, err = _fold(program, "T")
    assert err == 0.0 and not result.fired
    assert [(e.code, e.reason) for e in result.refused] == [
        ("tied", "the norm is applied at 2 sites; folding changes every one")] * 2
    assert {"n.weight", "n.bias"} <= set(result.module.state_dict())


def test_nonlinearity_between_norm_and_linear_is_kept() -> None:
    program = blockir.parse(HEAD + """block N(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  down: linear(D, D)
  y = x + down(gelu(n(x)))
  return y
}
""")
    result = apply_folds(program, "N")
    assert _codes(result) == {"n": ("nonlinearity", "the nonlinearity 'gelu(…)' lies between it and the linear")}
    assert result.program == program


def test_scale_on_a_bound_module_is_kept_as_opaque() -> None:
    program = blockir.parse(HEAD + """block E(x: [B, S, D]) -> [B, S, D] {
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = x + 0.5 * f(x)
  return y
}
""")
    bind = {"f": nn.Linear(64, 64)}
    result, err = _fold(program, "E", bind)
    assert err == 0.0 and not result.fired
    code, reason = _codes(result)["0.5 * %0"]
    assert code == "opaque" and "bound from Python" in reason
    assert result.module.get_submodule("f") is not bind["f"]


def test_dyt_affine_is_kept_because_no_affine_free_dyt_exists() -> None:
    program = blockir.parse(HEAD + """block Y(x: [B, S, D]) -> [B, S, D] {
  n: dyt(D)
  mlp: mlp(F)
  y = x + mlp(n(x))
  return y
}
""")
    result = apply_folds(program, "Y")
    assert _codes(result)["n"][0] == "no_form"
    assert result.program == program


def test_fold_apply_cli_prints_the_folded_program_and_the_log() -> None:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert main(["fold", str(ROOT / "examples" / "rezero.block"), "--block", "ReZeroLayer", "--apply"]) == 0
    text = out.getvalue()  # the program on stdout, the log on stderr
    head, _, log = err.getvalue().partition("folds of ReZeroLayer (mode infer)\n")
    assert head == ""
    folded = blockir.parse(text)
    assert not [d for d in blockir.verify(folded) if d.is_error]
    assert not [op for op in folded.block("ReZeroLayer").ops if isinstance(op, (ScaleOp, DropoutOp))]
    lines = log.splitlines()
    assert len(lines) == 4
    assert "resweight" in lines[2] and "fired  scale-into-linear: s ⊙ (W x + b)" in lines[2]


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_fold_cli_without_apply_keeps_the_legality_table(mode: str) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["fold", str(ROOT / "examples" / "deepnorm.block"), "--mode", mode]) == 0
    assert out.getvalue().startswith(f"block DeepNormLayer (mode {mode})")


def test_a_folded_weightless_rmsnorm_is_understood_by_keys_cost_fusion_and_legality() -> None:
    from blockir.reports.cost import norm_parameters
    from blockir.analyses.keys import reconcile
    from blockir.analyses.fold_legality import fold_report
    from blockir.passes.fuse import fuse_program

    program = blockir.load(ROOT / "examples" / "llama.block")
    module = blockir.compile(program, "LlamaDecoderLayer", seed=0, dtype=torch.float64)
    folded = apply_folds(program, "LlamaDecoderLayer", module)
    block = folded.program.block("LlamaDecoderLayer")
    norm = block.decl_map["input_layernorm"]
    assert norm.arg("affine") is False
    assert "input_layernorm.weight" not in folded.module.state_dict()
    assert reconcile(folded.program, "LlamaDecoderLayer", folded.module.state_dict()).ok
    assert norm_parameters(norm, {"D": 64}) == 0
    assert fold_report(block, "infer") == []  # nothing left to fold
    fused, _ = fuse_program(folded.program)
    assert not any(type(op).__name__ == "FusedAddNormOp" for op in fused.block("LlamaDecoderLayer").ops)
