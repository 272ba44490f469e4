"""Fold legality: what may fold where, and the exact reason when it may not."""
from __future__ import annotations

import io
from contextlib import redirect_stdout

import blockir
from blockir.cli import main
from blockir.analyses.fold_legality import fold_report
from conftest import ROOT

HEAD = """dim B: batch
dim S: seq
dim D: model = 64
dim F: hidden = 256
dim H: heads = 4
"""


def _example(stem: str, block: str, mode: str = "infer") -> dict[str, tuple]:
    program = blockir.parse((ROOT / "examples" / f"{stem}.block").read_text())
    return {s.name: (s.kind, s.legal, s.into, s.code) for s in fold_report(program.block(block), mode)}


def _report(body: str, mode: str = "infer") -> list[tuple]:
    block = blockir.parse(HEAD + body).blocks[0]
    return [(s.name, s.legal, s.into, s.code, s.reason) for s in fold_report(block, mode)]


def test_layerscale_folds_into_the_output_projection_in_inference() -> None:
    sites = _example("layerscale", "LayerScaleBlock")
    assert sites["ls1.gamma"] == ("scale", True, ("attn.o_proj.weight", "attn.o_proj.bias"), None)
    assert sites["ls2.gamma"] == ("scale", True, ("mlp.fc2.weight", "mlp.fc2.bias"), None)
    assert sites["norm2"] == ("affine", True, ("mlp.fc1.weight", "mlp.fc1.bias"), None)
    assert sites["drop_path(%2)"] == ("dropout", True, (), None)


def test_nothing_folds_in_training() -> None:
    sites = _example("layerscale", "LayerScaleBlock", "train")
    assert {(legal, code) for _, legal, _, code in sites.values()} == {(False, "training")}


def test_deepnorm_shortcut_scale_multiplies_both_paths() -> None:
    sites = _example("deepnorm", "DeepNormLayer")
    assert sites["alpha * x"] == ("scale", False, (), "shortcut")
    assert sites["ln_2"][3] == "not_linear"  # its output is the block's output


def test_reasons() -> None:
    assert _example("gpt2", "GPT2Block")["ln_1"][3] == "opaque"
    assert _example("dyt", "DyTBlock")["norm1"][3] == "no_bias"  # attn has no q/k/v bias to absorb DyT's shift
    assert _example("bert", "BertLayer")["attention.output.LayerNorm"][3] == "not_linear"
    assert _report("""block L(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  down: linear(F, D)
  y = x + down(0.5 * gelu(up(x)))
  return y
}
""") == [("0.5 * %1", True, ("down.weight",), None, None)]  # blocked upstream by gelu, folds into down's input
    assert _report("""block L(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  down: linear(F, D)
  y = x + 0.5 * down(gelu(up(x)))
  return y
}
""", "infer") == [("0.5 * %2", True, ("down.weight", "down.bias"), None, None)]


def test_nonlinearity_shared_weight_tied_and_rounding() -> None:
    assert _report("""block L(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  down: linear(F, D)
  y = x + down(gelu(0.5 * up(x)) + gelu(up(x)))
  return y
}
""")[0][:4] == ("0.5 * %0", False, (), "shared_weight")
    assert _report("""block L(x: [B, S, D]) -> [B, S, D] {
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = x + 0.5 * gelu(f(x))
  return y
}
""")[0] == ("0.5 * %1", False, (), "nonlinearity", "the nonlinearity 'gelu(…)' lies between it and the linear")
    assert _report("""block L(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D, tied=true)
  attn: self_attention(heads=H, bias=true)
  y = x + attn(n(x))
  return y
}
""")[0][:4] == ("n", False, (), "tied")
    assert _report("""block L(x: [B, S, D] bf16) -> [B, S, D] bf16 {
  down: linear(D, D)
  y = x + 0.5 * down(x)
  return y
}
""")[0] == ("0.5 * %0", False, (), "rounding",
            "the weights are stored in bf16: the folded product rounds, so the fold is not exact")


def test_fold_cli_table() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["fold", str(ROOT / "examples" / "rezero.block"), "--block", "ReZeroLayer", "--mode", "infer"]) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "block ReZeroLayer (mode infer)"
    assert any("resweight" in line and "yes  fold into the producer's output -> self_attn.o_proj.weight" in line
               for line in lines)
