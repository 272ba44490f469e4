"""Parameter keys and shapes, checked against real checkpoints, the fx backend, and reconcile."""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import blockir
from blockir.analyses.keys import key_layout, param_keys, reconcile
from blockir.diagnostics import BlockError
from blockir.cli import main
from conftest import EXAMPLES, ROOT

LLAMA = ROOT / "examples" / "llama.block"


def _llama() -> blockir.ir.Program:
    return blockir.parse(LLAMA.read_text(), str(LLAMA))


def test_llama_keys_equal_the_hf_decoder_layer() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, vocab_size=32)
    real = {k: tuple(v.shape) for k, v in LlamaDecoderLayer(config, 0).state_dict().items()}
    assert param_keys(_llama(), "LlamaDecoderLayer").shapes == real
    assert reconcile(_llama(), "LlamaDecoderLayer", LlamaDecoderLayer(config, 0).state_dict()).ok


def test_stack_keys_are_prefixed_per_layer() -> None:
    shapes = param_keys(_llama(), "LlamaModel").shapes
    assert len(shapes) == 2 * 9 + 1
    assert shapes["layers.1.self_attn.k_proj.weight"] == (32, 64)
    assert shapes["norm.weight"] == (64,)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_keys_equal_the_compiled_module(path: Path) -> None:
    program = blockir.parse(path.read_text(), str(path))
    for block in program.blocks:
        table = param_keys(program, block.name)
        if table.unknown:
            continue  # externs are bound from Python
        module = blockir.compile(program, block.name, backend="fx")
        assert table.shapes == {k: tuple(v.shape) for k, v in module.state_dict().items()}, block.name


def test_family_specific_state() -> None:
    program = blockir.parse("""dim B: batch
dim S: seq
dim D: model
block N(x: [B, S, D]) -> [B, S, D] {
  ln: layernorm(D, bias=false)
  plain: layernorm(D, affine=false)
  scale: scalenorm(D)
  dyt: dyt(D)
  g: scalar(init=0)
  v: vector(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = x + g * (v * f(dyt(scale(plain(ln(x))))))
  return y
}
""")
    with pytest.raises(BlockError) as info:
        param_keys(program, "N")
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.span.line, d.hint) == (
        "E0701", "dim 'D' has no size", 3, "give it when compiling: dims={'D': …} (CLI: --dims D=…)")
    table = param_keys(program, "N", {"D": 8})
    assert table.shapes == {"ln.weight": (8,), "scale.scale": (), "dyt.alpha": (1,), "dyt.weight": (8,),
                            "dyt.bias": (8,), "g": (), "v": (8,)}
    assert table.unknown == ("f",)


def test_reconcile_catches_a_layernorm_bias_offered_to_an_rmsnorm() -> None:
    shapes = dict(param_keys(_llama(), "LlamaDecoderLayer").shapes)
    shapes["input_layernorm.bias"] = (64,)
    shapes["mlp.down_proj.weight"] = (128, 64)  # transposed
    del shapes["mlp.up_proj.weight"]
    report = reconcile(_llama(), "LlamaDecoderLayer", shapes)
    assert not report.ok
    assert report.unexpected == ("input_layernorm.bias",)
    assert report.missing == ("mlp.up_proj.weight",)
    assert report.misshaped == (("mlp.down_proj.weight", (64, 128), (128, 64)),)
    assert str(report).splitlines() == [
        "'LlamaDecoderLayer' does not match the checkpoint:",
        "  family mismatch: 'input_layernorm' is an RMSNorm (scale only), but the checkpoint has "
        "'input_layernorm.bias', a LayerNorm bias",
        "  missing: mlp.up_proj.weight",
        "  unexpected: input_layernorm.bias",
        "  mis-shaped: mlp.down_proj.weight: expected [64, 128], got [128, 64]"]


def test_reconcile_a_bias_free_checkpoint_into_layernorm() -> None:
    program = blockir.parse((ROOT / "examples" / "gpt2.block").read_text())
    report = reconcile(program, "GPT2Block", {"ln_1.weight": (64,), "ln_2.weight": (64,), "ln_2.bias": (64,),
                                              "attn.c_attn.weight": (64, 192)})
    assert [f.message for f in report.family] == [
        "'ln_1' is a LayerNorm with a bias, but the checkpoint has only its weight (an RMSNorm or bias-free "
        "checkpoint)"]
    assert report.unchecked == ("attn.c_attn.weight",)


def test_keys_cli(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out):
        assert main(["keys", str(LLAMA), "--block", "LlamaDecoderLayer"]) == 0
    assert out.getvalue().splitlines()[:2] == ["block LlamaDecoderLayer:", "  input_layernorm.weight           [64]"]
    open_dims = tmp_path / "open.block"
    open_dims.write_text("dim B: batch\ndim D: model\nblock A(x: [B, D]) -> [B, D] {\n  n: rmsnorm(D)\n"
                         "  return n(x)\n}\n")
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        assert main(["keys", str(open_dims)]) == 1
        with pytest.raises(SystemExit) as usage:  # a malformed --dims is argparse's usage error
            main(["keys", str(open_dims), "--dims", "D=x"])
    assert usage.value.code == 2
    assert f"{open_dims}:2:5: error[E0701]: dim 'D' has no size" in err.getvalue()
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["keys", str(open_dims), "--dims", "D=16"]) == 0
    assert "n.weight  [16]" in out.getvalue()


def _stack(count: int, heads: str = "2", extra: str = "") -> blockir.ir.Program:
    return blockir.parse(f"""dim B: batch
dim S: seq
dim D: model = 8
block L(x: [B, S, D]) -> [B, S, D] {{
  n: rmsnorm(D)
  a: self_attention(heads={heads})
  {extra}
  y = x + a(n(x))
  return y
}}
model M(x: [B, S, D]) -> [B, S, D] {{
  layers: L * {count}
  return layers(x)
}}
""", "stack.block")


def test_equal_key_layouts_mean_equal_key_tables() -> None:
    variants = [_stack(3), _stack(3), _stack(4), _stack(3, heads="4, kv_heads=2"), _stack(3, extra="g: vector(D)"),
                _stack(3, heads="4, kv_heads=2 ** layer"), _stack(3, heads="4, kv_heads=2 ** layer")]
    for i, a in enumerate(variants):
        for j, b in enumerate(variants):
            same_layout = key_layout(a, "M") == key_layout(b, "M")
            assert same_layout == (param_keys(a, "M").shapes == param_keys(b, "M").shapes), (i, j)


def test_keys_of_a_deeply_nested_chain_need_no_recursion() -> None:
    text = "dim B: batch\ndim D: model = 4\nblock C0(x: [B, D]) -> [B, D] {\n  n: rmsnorm(D)\n  return n(x)\n}\n"
    text += "".join(f"block C{i}(x: [B, D]) -> [B, D] {{\n  inner: C{i - 1}\n  return inner(x)\n}}\n"
                    for i in range(1, 1500))
    program = blockir.parse(text, "chain.block")
    assert param_keys(program, "C1499").shapes == {"inner." * 1499 + "n.weight": (4,)}
    assert key_layout(program, "C1499") == key_layout(program, "C1499")
