"""Parameter keys and shapes, checked against real checkpoints, the fx backend, and reconcile."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

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
    assert out.getvalue().splitlines()[:2] == ["block LlamaDecoderLayer:",
                                               "  input_layernorm.weight           [64]       parameter  channel"]
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


TIED = """
dim B: batch
dim S: seq
dim D: model = 16
dim V: vocab = 32
dim H: heads = 2
dim F: hidden = 2 * D

block Layer(x: [B, S, D]) -> [B, S, D] {
  ln_1: layernorm(D)
  attn: self_attention(heads=H, fused=stacked, conv1d=true, bias=true)
  ln_2: batchnorm(D, padding=mask)
  mlp: gated_mlp(F, fused=true)
  h = x + attn(ln_1(x))
  y = h + mlp(ln_2(h))
  return y
}

model LM(ids: [B, S]) -> [B, S, V] {
  embed_tokens: embedding(V, D)
  layers: Layer * 2
  norm: rmsnorm(D)
  lm_head: head(V, tied=true)
  return lm_head(norm(layers(embed_tokens(ids))))
}
"""


def _tied() -> tuple[blockir.ir.Program, torch.nn.Module]:
    program = blockir.parse(TIED, "tied.block")
    return program, blockir.compile(program, "LM", dims={"B": 2, "S": 4}, seed=0)


def test_roles_layouts_and_aliases_equal_the_compiled_module() -> None:
    program, module = _tied()
    table = param_keys(program, "LM")
    params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    buffers = {n for n, _ in module.named_buffers()}
    assert params == {k.name for k in table.keys if k.role == "parameter"}
    assert buffers == {k.name for k in table.keys if k.role in ("buffer", "counter")}
    assert {k.name for k in table.keys if k.role == "counter"} == {
        f"layers.{i}.ln_2.{n}" for i in range(2) for n in ("num_batches_tracked", "calibrated_at")}
    assert table.aliases == {"lm_head.weight": "embed_tokens.weight"}
    assert module.lm_head.weight is module.embed_tokens.weight
    by_name = {k.name: k for k in table.keys}
    qkv = by_name["layers.0.attn.qkv_proj.weight"]
    assert (qkv.layout, qkv.fused, qkv.shape) == ("in,out", "q;k;v", (16, 48))
    assert module.get_parameter("layers.0.attn.qkv_proj.weight").shape == (16, 48)
    assert (by_name["layers.0.mlp.gate_up_proj.weight"].layout, by_name["layers.0.mlp.gate_up_proj.weight"].fused) \
        == ("out,in", "gate;up")
    assert by_name["embed_tokens.weight"].layout == "rows"
    assert by_name["layers.0.ln_2.running_var"].role == "buffer"


@pytest.mark.parametrize("omitted", ["lm_head.weight", "embed_tokens.weight", None])
def test_a_tied_table_loads_from_either_name_or_both(omitted: str | None) -> None:
    program, source = _tied()
    state = {k: v for k, v in source.state_dict().items() if k != omitted}
    target = blockir.compile(program, "LM", dims={"B": 2, "S": 4}, seed=1)
    result = target.load_state_dict(state, strict=True)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    assert torch.equal(target.lm_head.weight, source.embed_tokens.weight)
    assert target.lm_head.weight is target.embed_tokens.weight
    assert reconcile(program, "LM", state).ok


def test_an_untied_head_still_needs_its_own_weight() -> None:
    program = blockir.parse(TIED.replace("head(V, tied=true)", "head(V)"), "untied.block")
    state = {k: v for k, v in blockir.compile(program, "LM", dims={"B": 2, "S": 4}, seed=0).state_dict().items()
             if k != "lm_head.weight"}
    assert reconcile(program, "LM", state).missing == ("lm_head.weight",)
    assert param_keys(program, "LM").aliases == {}


def test_imported_gpt2_records_conv1d_and_its_tied_head() -> None:
    transformers = pytest.importorskip("transformers")
    from blockir.api import hf_block_text as block_text
    cfg = transformers.GPT2Config(vocab_size=97, n_embd=64, n_layer=1, n_head=4, n_positions=32)
    real = transformers.GPT2LMHeadModel(cfg)
    program = blockir.parse(block_text(real.config.to_dict()), "<gpt2>")
    table = param_keys(program, "GPT2LMHeadModel")
    by_name = {k.name: k for k in table.keys}
    assert table.aliases == {"lm_head.weight": "transformer.wte.weight"}
    assert by_name["transformer.h.0.attn.c_attn.weight"].layout == "in,out"
    assert by_name["transformer.h.0.attn.c_attn.weight"].fused == "q;k;v"
    assert by_name["transformer.h.0.mlp.c_fc.weight"].layout == "in,out"
    ours = blockir.compile(program, "GPT2LMHeadModel", seed=0)
    saved = {k: v for k, v in real.state_dict().items() if k != "lm_head.weight"}  # as a checkpoint omitting it
    assert ours.load_state_dict(saved, strict=True).missing_keys == []
    assert torch.equal(ours.get_parameter("lm_head.weight"), real.transformer.wte.weight)


def test_keys_cli_prints_roles_and_aliases(tmp_path: Path) -> None:
    path = tmp_path / "tied.block"
    path.write_text(TIED)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["keys", str(path), "--format", "json"]) == 0
    data = json.loads(out.getvalue())
    assert data["aliases"] == {"lm_head.weight": "embed_tokens.weight"}
    head = next(k for k in data["keys"] if k["name"] == "lm_head.weight")
    assert head == {"name": "lm_head.weight", "shape": [32, 16], "owner": "lm_head", "family": "head",
                    "role": "parameter", "layout": "out,in", "alias_of": "embed_tokens.weight"}
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["keys", str(path)]) == 0
    lines = out.getvalue().splitlines()
    assert lines[-1].split() == ["lm_head.weight", "[32,", "16]", "parameter", "out,in", "=", "embed_tokens.weight",
                                 "(tied:", "one", "tensor)"]
    assert "layers.0.ln_2.num_batches_tracked" in out.getvalue() and " counter " in out.getvalue()
