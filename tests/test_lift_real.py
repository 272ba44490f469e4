"""Lift on real layers: torch's Transformer layers and transformers' decoder and encoder layers lift
clean with a certificate of at most 1e-6 (fp32), and modules compiled from the examples lift back to
a block that ``blockir diff`` calls identical."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn

import blockir
from blockir.analyses.diff import diff_blocks, format_diff
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


Example = Callable[[], tuple[Program, str, nn.Module, tuple, dict]]


def _example(example: str, block: str, memory: bool = False, width: int = 64) -> Example:
    """A self-contained example block, compiled with its own initialisation and called on a random stream of its
    ``width`` (and, with ``memory``, a random memory of another length)."""
    def make() -> tuple[Program, str, nn.Module, tuple, dict]:
        program = blockir.load(ROOT / "examples" / f"{example}.block")
        torch.manual_seed(0)
        module = blockir.compile(program, block)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 5, width, generator=g)
        return program, block, module, (x, torch.randn(2, 7, width, generator=g)) if memory else (x,), {}
    return make


# every example that compiles on its own: its built-in attention lifts back as the same self_attention
ROUND_TRIP = {"gpt2": _real(R.build_gpt2_block), "bert": _real(R.build_bert_layer),
              # the example's attention soft-caps its scores: bound with a cap, it stays the example's extern
              "gemma2": _real(lambda: R.build_gemma2_decoder_layer(attn_logit_softcapping=50.0)),
              "olmo2": _real(R.build_olmo2_decoder_layer),
              "torch_encoder": _real(R.build_transformer_encoder_layer), "llama": _real(R.build_llama_decoder_layer),
              "llama model": _example("llama", "LlamaModel"), "parallel": _example("parallel", "ParallelBlock"),
              "layerscale": _example("layerscale", "LayerScaleBlock"), "rezero": _example("rezero", "ReZeroLayer"),
              "peri_ln": _example("peri_ln", "PeriLNLayer"), "normformer": _example("normformer", "NormFormerLayer"),
              "encoder_decoder": _example("encoder_decoder", "EncoderLayer"),
              "encoder_decoder decoder": _example("encoder_decoder", "DecoderLayer", memory=True),
              "encoder_decoder decoder model": _example("encoder_decoder", "Decoder", memory=True),
              "unet_skip": _example("unet_skip", "Layer"), "unet_skip UNet": _example("unet_skip", "UNet"),
              "dyt": _example("dyt", "DyTBlock"), "prepbn": _example("prepbn", "PRepBNBlock"),
              "deepscalelm": _example("deepscalelm", "DeepScaleLMLayer"),
              "t5": _real(R.build_t5_layer_ff), "deepnorm": _example("deepnorm", "DeepNormLayer"),
              "ngpt": _example("ngpt", "NGPTLayer"), "gpt_neox": _real(R.build_gpt_neox_layer),
              "powernorm": _example("powernorm", "PowerNormLayer"),
              "partial_rmsnorm": _example("partial_rmsnorm", "PartialRMSNormLayer"),
              "partial_rmsnorm model": _example("partial_rmsnorm", "PartialRMSNormModel")}


# bound real branches the lift reads as the built-in they compute: the lift is the example with that declaration
# in place of the extern
BUILT_IN = {"gpt_neox": ("attention", "self_attention(heads=4, causal=true, rope=true, rotary_dim=4, bias=true, "
                                      "out_bias=true, impl=eager, fused=heads, qkv=query_key_value, o=dense)")}


def _expected(program: Program, example: str) -> Program:
    if example not in BUILT_IN:
        return program
    name, text = BUILT_IN[example]
    extern = f"  {name}: extern(x: [B, S, D]) -> [B, S, D]\n"
    source = Path(program.filename).read_text()
    assert extern in source
    return blockir.parse(source.replace(extern, f"  {name}: {text}\n"), program.filename)


# the layer input feeds both norms and the sum: the lift writes the branches in the other order, so the terms of
# its gradient are summed in another order (one rounding)
NOT_BITWISE = {"gpt_neox": TOLERANCE}


@pytest.mark.parametrize("example", ROUND_TRIP)
def test_a_compiled_example_lifts_back_identical(example: str) -> None:
    program, block, module, args, ctx = ROUND_TRIP[example]()
    result = blockir.lift(module, *args, **ctx)
    assert result.diagnostics == [], result.render()
    assert result.max_error is not None and result.max_error <= NOT_BITWISE.get(example, 0.0)
    assert result.program is not None
    expected = _expected(program, example)
    assert diff_blocks(expected, expected.block(block), result.program, result.program.block(result.block)).identical


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
    assert "  attn: self_attention(heads=4, causal=true, rope=true, qk_norm=l2norm, qk_scale=true, scale=4.0)\n" in \
        _lifted_text("ngpt")


@pytest.mark.parametrize("attention, inputs", [
    ("cross_attention(heads=4, dropout=0.1)", "x, memory"),
    ("self_attention(heads=4, causal=true, qk_norm=l2norm, dropout=0.1, fused=stacked)", "x"),
    ("self_attention(heads=2, causal=true, qk_norm=l2norm, qk_scale=true, scale=4.0, dropout=0.2, fused=heads)", "x")])
def test_an_attention_lifts_back_with_its_dropout_whatever_its_layout(attention: str, inputs: str) -> None:
    """Attention-probability dropout, read from a training-mode run, beside a memory, a fused q/k/v matrix and
    nGPT's normalised q/k: the lift is the declaration compiled."""
    params = "x: [B, S, D], memory: [B, T, D]" if "memory" in inputs else "x: [B, S, D]"
    source = (f"dim B: batch\ndim S: seq\ndim T: seq\ndim D: model = 32\n\nblock A({params}) -> [B, S, D] {{\n"
              f"  attn: {attention}\n  y = x + attn({inputs})\n  return y\n}}\n")
    torch.manual_seed(0)
    module = blockir.compile(blockir.parse(source), "A")
    args = (torch.randn(2, 5, 32), torch.randn(2, 7, 32))[:len(inputs.split(", "))]
    result = blockir.lift(module, *args)
    assert result.diagnostics == [] and result.max_error == 0.0, result.render()
    assert f"  attn: {attention}\n" in result.text and f" = attn({inputs})\n" in result.text



def test_what_the_trace_cannot_show_is_read_back_from_the_compiled_block() -> None:
    # the target stream's own axis name, init-only arguments and a stated fact, none of them on the graph
    text = _lifted_text("encoder_decoder decoder")
    assert "block DecoderLayer(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {\n" in text
    assert "  src_attn: cross_attention(heads=4, bias=true, out_bias=true)\n" in text
    text = _lifted_text("deepscalelm")
    assert "  const deepscalelm = 1\n" in text and "init_std=fan_in" in text
    assert "  norm1: dyt(D, alpha=0.5, offset=0)\n" in _lifted_text("dyt")
    assert "  a = dropout(attention_2, p=0.0)\n" in _lifted_text("gpt_neox")  # compiled to nothing
    text = _lifted_text("deepnorm")  # the shortcut scale is the depth constant it is in this layer
    assert "  const alpha = (2 * num_layers) ** 0.25\n" in text and "= alpha * x\n" in text
    assert "  norm1: prepbn(D, eps=1e-05, momentum=0.1, padding=mask, running=true, accum=f32, steps=1000, " \
        "ln_eps=1e-05, eta=1)\n" in _lifted_text("prepbn")



def test_a_depth_constant_the_trace_shows_only_as_a_number_is_located() -> None:
    source = ("dim B: batch\ndim S: seq\ndim D: model = 32\n\nblock Scaled(x: [B, S, D]) -> [B, S, D] {\n"
              "  const g0 = 1 / num_layers\n  g: scalar(init=g0)\n  ln: layernorm(D)\n  y = x + g * ln(x)\n"
              "  return y\n}\n")
    result = blockir.lift(blockir.compile(blockir.parse(source, "scaled.block"), "Scaled"), torch.randn(2, 5, 32))
    assert [(d.code, str(d.span), d.severity) for d in result.diagnostics] == [("W0920", "scaled.block:6:9", "warning")]
    assert result.diagnostics[0].message == ("'Scaled' uses g0 = 1 / num_layers, which depends on the layer or the "
                                             "stack's depth: the trace shows only its value in this compiled layer, "
                                             "1, and the lift writes that number")
    assert "  g: scalar(init=1)\n" in result.text and result.max_error == 0.0


def test_a_hand_written_dyt_lifts_as_dyt() -> None:
    class DyT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.alpha = nn.Parameter(torch.full((1,), 0.8))
            self.weight, self.bias = nn.Parameter(torch.rand(32)), nn.Parameter(torch.rand(32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.weight * torch.tanh(self.alpha * x) + self.bias

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.fc = DyT(), nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc(self.norm(x))

    result = blockir.lift(Block(), torch.randn(2, 5, 32))
    assert result.diagnostics == [], result.render()
    assert "  norm: dyt(D, alpha=0.8)\n" in result.text and result.max_error == 0.0


# every example block that does not lift back identical, and the located diagnostic or difference that says why
NOT_ROUND_TRIP = {
    # the layers carry the attention scores beside the state
    "realformer": (_example("realformer", "RealFormer"), "examples/realformer.block:12:7: error[E0920]: "
                   "'RealFormerLayer' returns 2 results and carries a [B, H, S, S] value beside its state", None),
    # no lift rule reads a mixture of experts: its branch stays the compiled module, bound as an extern
    # no lift rule reads Fixup's scalar biases inside a built-in branch, so both branches stay externs
    "fixup": (_example("fixup", "FixupLayer"), None, "vs  self_attn: extern(x: [B, S, D]) -> [B, S, D]"),
    "moe": (_example("moe", "MixtralDecoderLayer", width=32), None,
            "declarations: mlp: moe(F, experts=4, top_k=2, act=silu, routing=softmax_topk, norm_topk=true, "
            "weights=f32, shared_gate=false)  vs  mlp: extern(x: [B, S, D]) -> [B, S, D]"),
}
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.block"))


def test_every_example_is_listed() -> None:
    listed = {k.split()[0] for k in [*ROUND_TRIP, *NOT_ROUND_TRIP]}
    assert listed == set(EXAMPLES)


@pytest.mark.parametrize("example", NOT_ROUND_TRIP)
def test_an_example_that_does_not_lift_back_says_why(example: str) -> None:
    make, diagnostic, difference = NOT_ROUND_TRIP[example]
    program, block, module, args, ctx = make()
    result = blockir.lift(module, *args, **ctx)
    assert (diagnostic is None) == (result.diagnostics == []), result.render()
    if diagnostic is not None:
        assert diagnostic in result.render()
    if difference is not None:
        d = diff_blocks(program, program.block(block), result.program, result.program.block(result.block))
        assert not d.identical and difference in format_diff(d, "source", "lift")
