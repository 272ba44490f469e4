"""Lift on real layers: torch's Transformer layers and transformers' decoder and encoder layers lift
clean with a certificate of at most 1e-6 (fp32), and modules compiled from the examples lift back to
a block that ``blockir diff`` calls identical."""
from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn

import blockir
from blockir.analyses.diff import diff_blocks
from blockir.ir.program import Program
from blockir.lift.hf import hf_layer
from conformance import real_models as R
from conftest import ROOT
from lift_models import one_thread  # noqa: F401  (fixture)

TOLERANCE = 1e-6


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("decoder", [False, True])
def test_torch_transformer_layers(decoder: bool, norm_first: bool) -> None:
    torch.manual_seed(0)
    cls = torch.nn.TransformerDecoderLayer if decoder else torch.nn.TransformerEncoderLayer
    layer = cls(32, 4, 64, batch_first=True, norm_first=norm_first)
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    result = blockir.lift(layer, x, memory) if decoder else blockir.lift(layer, x)
    assert result.diagnostics == [], result.render()
    assert result.max_error == 0.0
    norms = sorted(line.split(":")[0].strip() for line in result.text.splitlines() if "layernorm(" in line)
    assert norms == (["norm1", "norm2", "norm3"] if decoder else ["norm1", "norm2"])
    first_eq = next(line for line in result.text.splitlines() if line.startswith("  ") and " = " in line)
    assert first_eq.endswith("= norm1(tgt)" if decoder else "= norm1(src)") == norm_first
    if decoder:
        assert "  multihead_attn: extern(x: [B, S, D], x1: [B, T, D]) -> [B, S, D]\n" in result.text


HF = {"llama": ["rmsnorm(D, eps=1e-06, cast=before_weight)", "gated_mlp(F, act=silu, bias=false)",
                "self_attn: self_attention(heads=4, kv_heads=2, causal=true, rope=true, impl=eager)"],
      "gpt2": ["layernorm(D, eps=1e-05)"],
      "bert": ["layernorm(D, eps=1e-12)", "attention.output.dense: linear(D, D, bias=true)"],
      "gpt_neox": ["mlp(F, act=gelu, bias=true, fc1=dense_h_to_4h, fc2=dense_4h_to_h)"],
      "gemma2": ["rmsnorm(D, eps=1e-06, offset=1, cast=after_weight)", "gated_mlp(F, act=gelu_tanh, bias=false)"],
      "olmo2": ["post_feedforward_layernorm: rmsnorm(D, eps=1e-05, cast=after_weight)"],
      "phi": ["layernorm(D, eps=1e-05)"]}


@pytest.mark.parametrize("model_type", HF)
def test_transformers_layers_lift_clean_and_certified(model_type: str) -> None:
    layer, (args, kwargs) = hf_layer(model_type, 2, 5, 64)
    result = blockir.lift(layer, *args, **kwargs)
    assert result.diagnostics == [], result.render()
    assert result.max_error is not None and result.max_error <= TOLERANCE
    for text in HF[model_type]:
        assert text in result.text
    assert result.text.count(" + ") >= 2  # the two residual updates (Phi: attn + mlp, then + x)


def _real(build: Callable[[], R.RealLayer]) -> Callable[[], tuple[Program, str, nn.Module, tuple, dict]]:
    """A real reference layer's example, compiled with the real layer's bindings and called with its context."""
    def make() -> tuple[Program, str, nn.Module, tuple, dict]:
        real = build()
        program = blockir.load(ROOT / real.example)
        x, ctx = real.make_inputs()
        return (program, real.block, blockir.compile(program, real.block, bind=real.bind), (x,),
                {k: v for k, v in ctx.items() if k != "position_ids"})
    return make


def _example(example: str, block: str) -> Callable[[], tuple[Program, str, nn.Module, tuple, dict]]:
    """A self-contained example block, compiled with its own initialisation and called on a random stream."""
    def make() -> tuple[Program, str, nn.Module, tuple, dict]:
        program = blockir.load(ROOT / "examples" / f"{example}.block")
        torch.manual_seed(0)
        module = blockir.compile(program, block)
        return program, block, module, (torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0)),), {}
    return make


# every example that compiles on its own: its built-in attention lifts back as the same self_attention
ROUND_TRIP = {"gpt2": _real(R.build_gpt2_block), "bert": _real(R.build_bert_layer),
              "olmo2": _real(R.build_olmo2_decoder_layer),
              "torch_encoder": _real(R.build_transformer_encoder_layer), "llama": _real(R.build_llama_decoder_layer),
              "llama model": _example("llama", "LlamaModel"), "parallel": _example("parallel", "ParallelBlock"),
              "layerscale": _example("layerscale", "LayerScaleBlock"), "rezero": _example("rezero", "ReZeroLayer"),
              "peri_ln": _example("peri_ln", "PeriLNLayer"), "normformer": _example("normformer", "NormFormerLayer"),
              "encoder_decoder": _example("encoder_decoder", "EncoderLayer"),
              "unet_skip": _example("unet_skip", "Layer")}


@pytest.mark.parametrize("example", ROUND_TRIP)
def test_a_compiled_example_lifts_back_identical(example: str) -> None:
    program, block, module, args, ctx = ROUND_TRIP[example]()
    result = blockir.lift(module, *args, **ctx)
    assert result.diagnostics == [], result.render()
    assert result.max_error == 0.0
    assert result.program is not None
    assert diff_blocks(program, program.block(block), result.program, result.program.block(result.block)).identical


@pytest.mark.parametrize("softcap, attention", [
    (None, "self_attention(heads=4, kv_heads=2, causal=true, rope=true, impl=eager)"),
    (50.0, "extern(x: [B, S, D]) -> [B, S, D]")])
def test_a_bound_gemma2_attention_lifts_as_the_built_in_it_computes(softcap: float | None, attention: str) -> None:
    """The example's Gemma 2 layer, its attention bound without the soft-cap, is exactly a built-in: the run
    proposes its head width from the caller's rotary tables and confirms it bit for bit."""
    _, _, module, args, ctx = _real(lambda: R.build_gemma2_decoder_layer(attn_logit_softcapping=softcap))()
    result = blockir.lift(module, *args, **ctx)
    assert result.diagnostics == [] and result.max_error == 0.0, result.render()
    assert f"  self_attn: {attention}\n" in result.text


def _lifted_text(example: str) -> str:
    _, _, module, args, ctx = ROUND_TRIP[example]()
    return blockir.lift(module, *args, **ctx).text


def test_a_built_in_attention_is_lifted_with_its_settings() -> None:
    assert "  self_attn: self_attention(heads=4, causal=true, head_scale=true)\n" in _lifted_text("normformer")
    assert "  attn: self_attention(heads=4, causal=false, bias=true, out_bias=true)\n" in _lifted_text("layerscale")
    assert "  self_attn: self_attention(heads=4, kv_heads=2, causal=true, rope=true)\n" in _lifted_text("llama")
