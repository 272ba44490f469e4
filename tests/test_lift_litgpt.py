"""Lift on litgpt's ``Block`` at tiny sizes: the decoder layer of every litgpt model, configured as LLaMA
(RMSNorm, LLaMAMLP), GPT-NeoX (parallel residual, LayerNorm, GptNeoxMLP, partial rotary) and Gemma 2
(a norm after each branch, ``1 + w`` RMSNorms), each certified against the original forward and every
gradient, and litgpt's whole ``GPT``. Its attention declares no head width: the width of the rotary tables
its caller passes proposes one, and a run confirms the built-in bit for bit (a soft-capped one stays an extern).

litgpt pins an older huggingface_hub than transformers 5 needs, so it is installed without its
dependencies (``pip install --no-deps litgpt``) and the ones ``litgpt.model`` imports come from the
``litgpt`` extra."""
from __future__ import annotations

import pytest
import torch

import blockir
from lift_models import one_thread  # noqa: F401  (fixture)

litgpt_model = pytest.importorskip("litgpt.model")
from litgpt.config import Config  # noqa: E402

TINY = dict(n_embd=32, n_head=4, n_layer=1, block_size=16, vocab_size=64, padded_vocab_size=64, intermediate_size=64)


def _lift(**settings: object) -> tuple[torch.nn.Module, blockir.LiftResult]:
    config = Config(**TINY, **settings)
    torch.manual_seed(0)
    block = litgpt_model.Block(config, block_idx=0).eval()
    if config.norm_class_name == "RMSNorm" and "Gemma" in config.name:  # a checkpoint's 1 + w norms hold w
        with torch.no_grad():
            for name, p in block.named_parameters():
                if name.startswith(("norm_", "post_")):
                    p.zero_()
    cos, sin = litgpt_model.build_rope_cache(8, n_elem=config.rope_n_elem)
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0))
    return block, blockir.lift(block, x, cos.expand(2, -1, -1), sin.expand(2, -1, -1))


def test_litgpt_block_as_llama_lifts_clean() -> None:
    block, result = _lift(n_query_groups=2, bias=False, norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP",
                          parallel_residual=False, rotary_percentage=1.0)
    assert result.diagnostics == [], result.render()
    assert result.max_error is not None and result.max_error <= 1e-6
    assert result.text[result.text.index("block Block"):] == """\
block Block(x: [B, S, D]) -> [B, S, D] {
  norm_1: rmsnorm(D, eps=1e-05, cast=after_weight)
  attn: self_attention(heads=4, kv_heads=2, causal=true, rope=true, fused=stacked, qkv=qkv, o=proj)
  norm_2: rmsnorm(D, eps=1e-05, cast=after_weight)
  mlp: gated_mlp(F, act=silu, bias=false, gate=fc_1, up=fc_2, down=proj)
  to = norm_1(x)
  attn_2 = attn(to)
  add_1 = attn_2 + x
  to_1 = norm_2(add_1)
  mlp_2 = mlp(to_1)
  add_3 = mlp_2 + add_1
  return add_3
}
"""
    compiled = blockir.compile(result.program, result.block, dims={"B": 2, "S": 8}, bind=result.bind)
    loaded = compiled.load_state_dict(block.state_dict(), strict=True)
    assert (loaded.missing_keys, loaded.unexpected_keys) == ([], [])


def test_litgpt_block_as_gpt_neox_lifts_its_parallel_residual() -> None:
    _, result = _lift(bias=True, norm_class_name="LayerNorm", mlp_class_name="GptNeoxMLP", rotary_percentage=0.25,
                      parallel_residual=True)
    assert result.diagnostics == [], result.render()
    assert result.max_error is not None and result.max_error <= 1e-6
    assert "  mlp: mlp(F, act=gelu, bias=true, fc1=fc, fc2=proj)\n" in result.text
    assert "  attn: self_attention(heads=4, causal=true, rope=true, rotary_dim=2, bias=true, out_bias=true, " \
        "fused=stacked, qkv=qkv, o=proj)\n" in result.text
    assert "  add = attn_2 + x\n  add_1 = mlp_2 + add\n" in result.text  # both branches read x: one update


GEMMA2 = dict(name="Gemma-2-tiny", n_query_groups=2, rotary_percentage=1.0, bias=False, norm_class_name="RMSNorm", mlp_class_name="GemmaMLP",
              gelu_approximate="tanh", parallel_residual=False, post_attention_norm=True, post_mlp_norm=True,
              attention_logit_softcapping=50.0)


def test_litgpt_block_as_gemma2_lifts_its_sandwich_norms() -> None:
    _, result = _lift(**GEMMA2)
    assert result.diagnostics == [], result.render()
    assert result.max_error is not None and result.max_error <= 1e-6
    for norm in ("norm_1", "post_attention_norm", "norm_2", "post_mlp_norm"):
        assert f"  {norm}: rmsnorm(D, eps=1e-05, offset=1, cast=after_weight)\n" in result.text
    assert "  to_1 = post_attention_norm(attn_2)\n" in result.text
    assert "  attn: extern(x: [B, S, D]) -> [B, S, D]\n" in result.text  # the soft-cap


def test_a_whole_litgpt_gpt_lifts_as_one_model() -> None:
    config = Config(**{**TINY, "n_layer": 2}, n_query_groups=2, bias=False, norm_class_name="RMSNorm",
                    mlp_class_name="LLaMAMLP", parallel_residual=False)
    torch.manual_seed(0)
    model = litgpt_model.GPT(config).eval()
    result = blockir.lift(model, torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0)))
    assert result.diagnostics == [], result.render()
    assert result.max_error is not None and result.max_error <= 1e-6
    assert result.text[result.text.index("model GPT"):] == """\
model GPT(ids: [B, S]) -> [B, S, V] {
  transformer.wte: embedding(V, D)
  transformer.ln_f: rmsnorm(D, eps=1e-05, cast=after_weight)
  lm_head: head(V, tied=false)
  transformer.h: Block * 2
  embedded = transformer.wte(ids)
  layer_1 = transformer.h(embedded)
  normed = transformer.ln_f(layer_1)
  logits = lm_head(normed)
  return logits
}
"""
    assert "  attn: self_attention(heads=4, kv_heads=2, causal=true, rope=true, rotary_dim=2, fused=stacked, " \
        "qkv=qkv, o=proj)\n" in result.text  # litgpt's default rotary_percentage=0.25
    compiled = blockir.compile(result.program, result.block, dims={"B": 2, "S": 5})
    loaded = compiled.load_state_dict(model.state_dict(), strict=True)
    assert (loaded.missing_keys, loaded.unexpected_keys) == ([], [])


def test_litgpt_gemma_norms_initialised_at_one_are_e0909() -> None:
    """litgpt's RMSNorm starts its weight at ones and, for Gemma, scales by 1 + weight: twice the identity."""
    config = Config(**TINY, **GEMMA2)
    torch.manual_seed(0)
    block = litgpt_model.Block(config, block_idx=0)
    cos, sin = litgpt_model.build_rope_cache(8, n_elem=config.rope_n_elem)
    x = torch.randn(2, 8, 32)
    found = blockir.lift(block, x, cos.expand(2, -1, -1), sin.expand(2, -1, -1)).diagnostics
    assert sorted(d.message.split("'")[1] for d in found if d.code == "E0909") == [
        "norm_1.weight", "norm_2.weight", "post_attention_norm.weight", "post_mlp_norm.weight"]
    assert {d.span.filename for d in found} == {litgpt_model.__file__}
