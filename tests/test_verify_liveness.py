"""Liveness: the buffer plan in both modes, the CLI acceptance on LLaMA, and @inplace diagnostics."""
from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest

import blockir
from blockir.cli import main
from blockir.passes.fuse import fuse_program
from blockir.analyses.liveness import plan
from conftest import ROOT

LLAMA = ROOT / "examples" / "llama.block"
HEAD = """dim B: batch
dim S: seq
dim D: model = 64
"""


def _llama() -> blockir.ir.Block:
    return blockir.parse(LLAMA.read_text(), str(LLAMA)).block("LlamaDecoderLayer")


def _cli(*argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def test_llama_infer_writes_both_residual_adds_in_place() -> None:
    text = _cli("liveness", str(LLAMA), "--block", "LlamaDecoderLayer", "--mode", "infer")
    assert "h = x + %1                         in place: writes over 'x'" in text
    assert "y = h + %3                         in place: writes over 'h'" in text
    assert "b0 [B, S, D]        x, h, y" in text
    assert "peak live [B, S, D] tensors: 3" in text


def test_llama_train_writes_none_in_place_and_names_the_saved_value() -> None:
    text = _cli("liveness", str(LLAMA), "--block", "LlamaDecoderLayer", "--mode", "train")
    assert "in place" not in text.replace("out of place", "")
    assert ("h = x + %1                         out of place: 'x' stays: 'input_layernorm' saves it for backward "
            f"(a norm keeps its input and row statistics), at {LLAMA}:29:21") in text
    assert ("y = h + %3                         out of place: 'h' stays: 'post_attention_layernorm' saves it for "
            f"backward (a norm keeps its input and row statistics), at {LLAMA}:30:15") in text
    assert "%0 = input_layernorm(x)            'x', row statistics [B, S, 1]" in text


def test_plan_api() -> None:
    block = _llama()
    infer, train = plan(block, "infer"), plan(block, "train")
    assert [d.inplace for d in infer.adds] == [True, True]
    assert infer.buffer_of("x") == infer.buffer_of("h") == infer.buffer_of("y")
    assert infer.peak == 3
    assert [(d.inplace, d.kind, d.blocker.decl) for d in train.adds] == [
        (False, "saved", "input_layernorm"), (False, "saved", "post_attention_layernorm")]
    assert train.peak == 6
    assert {k.op.result: k.values for k in train.kept} == {"%0": ("x",), "%1": ("%0",), "%2": ("h",), "%3": ("%2",)}
    with pytest.raises(ValueError):
        plan(block, "eval")  # type: ignore[arg-type]


def test_dropout_keeps_a_mask_and_a_learned_scale_its_input() -> None:
    program = blockir.parse((ROOT / "examples" / "layerscale.block").read_text())
    kept = {k.op.result: (k.values, k.state) for k in plan(program.block("LayerScaleBlock"), "train").kept}
    assert kept["%2"] == (("%1",), ())  # ls1.gamma * attn(…)
    assert kept["%3"] == ((), ("mask [B, 1, 1] or its seed",))  # drop_path: one draw per sample


def test_fused_llama_still_writes_in_place_in_inference() -> None:
    fused, _ = fuse_program(blockir.parse(LLAMA.read_text(), str(LLAMA)))
    decisions = plan(fused.block("LlamaDecoderLayer"), "infer").adds
    assert [(d.result, d.target, d.inplace) for d in decisions] == [("h", "x", True), ("y", "h", True)]


def diags(body: str) -> list[tuple[str, str, int, int, list[tuple[int, int]]]]:
    text = HEAD + body
    return [(d.code, d.message, d.span.line - 3, d.span.column, [(n.span.line - 3, n.span.column) for n in d.notes])
            for d in blockir.verify(blockir.parse(text, "t.block"))]


def test_e0501_later_reader() -> None:
    assert diags("""block L(x: [B, S, D]) -> [B, S, D] {
  n: rmsnorm(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  g: extern(x: [B, S, D]) -> [B, S, D]
  @inplace h = x + f(n(x))
  y = h + g(x)
  return y
}
""") == [("E0501", "@inplace 'h' cannot overwrite 'x': 'g' reads it later", 5, 16, [(6, 11)])]


def test_e0502_operand_may_be_a_view_of_the_target() -> None:
    assert diags("""block L(x: [B, S, D]) -> [B, S, D] {
  f: extern(x: [B, S, D]) -> [B, S, D]
  @inplace y = x + f(x)
  return y
}
""") == [("E0502", "@inplace 'y' cannot overwrite 'x': the other operand 'f(…)' may share its storage", 3, 16,
          [(3, 20)])]


def test_e0503_result_dtype_differs_from_the_storage() -> None:
    assert diags("""block L(x: [B, S, D] bf16) -> [B, S, D] f32 {
  n: rmsnorm(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  @inplace y = cast(f(n(x)), f32) + x
  return y
}
""") == [("E0503", "@inplace 'y' cannot overwrite 'x': the result is f32, the storage bf16", 4, 16, [])]


TRAINED = """block L(x: [B, S, D]) -> [B, S, D] {{
{consts}  n: rmsnorm(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  @inplace y = x + f(n(x))
  return y
}}
"""


def test_inplace_legal_only_in_inference() -> None:
    message = ("@inplace 'y' would overwrite 'x', but 'n' saves it for backward (a norm keeps its input and row "
               "statistics)")
    assert diags(TRAINED.format(consts="")) == [("W0501", message + " in training", 4, 16, [(4, 22)])]
    assert diags(TRAINED.format(consts="  const training = 1\n")) == [("E0504", message, 5, 16, [(5, 22), (2, 9)])]
    assert diags(TRAINED.format(consts="  const training = 0\n")) == []


def test_examples_have_no_liveness_findings() -> None:
    from conftest import EXAMPLES
    for path in EXAMPLES:
        program = blockir.parse(path.read_text(), str(path))
        assert not [d for d in blockir.verify(program) if d.code[1:3] == "05"]
        for block in program.blocks:
            for mode in ("train", "infer"):
                p = plan(block, mode)
                assert p.peak >= 1 and {v for v, _ in p.buffers} >= {i.result for i in block.inputs}
