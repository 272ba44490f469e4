"""Compiled example blocks against the real layers they describe.

Each example is compiled with the real submodules bound, loaded from the real
layer's state_dict with ``strict=True``, and compared with the real layer on
the forward output, the input gradient and every parameter gradient, in eval
and in train mode, with and without padding. In bf16 the compiled block must
stay as close to an fp32 reference as the real bf16 layer does. Deliberately
wrong topologies show the comparison can fail, and ``blockir.trace`` is
checked value by value against a step-by-step composition of the real layer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import blockir
from blockir.lower.adapters import llama_attention
from blockir.lower.layers.rotary import rope_cos_sin
from blockir.ir.program import Program

from . import real_models as R

REPO = Path(__file__).resolve().parents[2]
RTOL, ATOL = 1e-5, 1e-6
# 32 fp32 ulps of a gradient's largest entry; see _assert_conformant
GRAD_ATOL = 32 * torch.finfo(torch.float32).eps
MODELS = sorted(R.BUILDERS)
# The LLaMA examples use the built-in attention (SDPA) instead of the real eager
# one, which sums in another order; every other example runs the real layer's
# own ops and must match bit for bit.
BUILTIN_ATTENTION = ("LlamaDecoderLayer", "LlamaModel")
# T5LayerFF takes no mask: its real forward has no attention
PADDABLE = [name for name in MODELS if name != "T5LayerFF"]


@dataclass
class Run:
    """What one forward + backward produced."""

    y: Tensor
    x_grad: Tensor
    grads: dict[str, Tensor | None]


def _cotangent(seed: int = 1) -> Tensor:
    # exactly representable in bf16, so fp32 and bf16 runs pull back the same vector
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(R.B, R.S, R.D, generator=gen).bfloat16().float()


def _run(module: nn.Module, call: Callable[..., Tensor], x: Tensor, ctx: dict[str, Any],
         skip: tuple[str, ...] = ()) -> Run:
    """Forward, then backward of a fixed random cotangent (not a plain sum, so grads see every output)."""
    x = x.detach().clone().requires_grad_(True)
    module.zero_grad(set_to_none=True)
    # the Python path of nn.MultiheadAttention, as the real reference uses
    with R.mha_fastpath(False):
        y = call(x, **ctx)
    y.backward(_cotangent().to(y.dtype))
    grads = {k: p.grad for k, p in module.named_parameters() if k not in skip}
    return Run(y.detach(), x.grad, grads)


def _source(example: str, *, dropout_free: bool) -> Program:
    """The example, with its drop probabilities set to 0 when the real layer was built with dropout 0.

    The examples declare the released configs' p (0.1); a train-mode comparison
    without randomness needs p=0 on both sides.
    """
    text = (REPO / example).read_text()
    if dropout_free:
        text = re.sub(r"\bp=[0-9.]+", "p=0.0", text)
    return blockir.parse(text, example)


def _compile(real: R.RealLayer, twin: R.RealLayer, *, train: bool = False,
             dtype: torch.dtype = torch.float32, program: Program | None = None) -> torch.fx.GraphModule:
    """Compile ``real``'s example with ``twin``'s submodules bound and ``real``'s weights loaded.

    ``twin`` is a second build with the same seed: bound externs become part
    of the compiled module, so binding ``real``'s own submodules would make the
    two sides share parameters and their gradients.
    """
    program = program if program is not None else _source(real.example, dropout_free=train)
    m = blockir.compile(program, real.block, bind=twin.bind, dtype=dtype)
    m.load_state_dict(real.block_state_dict(), strict=True)
    return m.train(train)


def _pair(name: str, *, train: bool, dtype: torch.dtype = torch.float32) -> tuple[R.RealLayer, torch.fx.GraphModule]:
    real = R.BUILDERS[name](dtype=dtype, dropout=0.0)
    m = _compile(real, R.BUILDERS[name](dtype=dtype, dropout=0.0), train=train, dtype=dtype)
    real.module.train(train)
    shared = {id(p) for p in m.parameters()} & {id(p) for p in real.module.parameters()}
    assert not shared, "compiled and reference modules must not share parameters"
    return real, m


def _compare(name: str, *, train: bool, padded: bool) -> tuple[Run, Run]:
    real, m = _pair(name, train=train)
    x, ctx = real.make_inputs(padded=padded)
    got = _run(m, m, x, ctx)
    want = _run(real.module, real.reference, x, ctx, skip=real.outside_keys)
    return got, want


def _assert_conformant(got: Run, want: Run, *, exact: bool) -> None:
    """Output, input gradient and every parameter gradient, keyed by the real parameter names.

    ``exact``: bit for bit. Otherwise the output within rtol=1e-5, atol=1e-6,
    and each gradient within rtol=1e-5 plus GRAD_ATOL times its largest
    entry: a gradient sums contributions over rows, positions and layers that
    cancel, so an entry near zero carries the rounding of the large terms it
    was summed from.
    """
    pairs = {"x": (got.x_grad, want.x_grad)}
    assert got.grads.keys() == want.grads.keys()
    for k, g in got.grads.items():
        assert g is not None and want.grads[k] is not None, k
        pairs[k] = (g, want.grads[k])
    if exact:
        assert torch.equal(got.y, want.y)
        for k, (g, w) in pairs.items():
            assert torch.equal(g, w), k
        return
    torch.testing.assert_close(got.y, want.y, rtol=RTOL, atol=ATOL)
    for k, (g, w) in pairs.items():
        torch.testing.assert_close(g, w, rtol=RTOL, atol=GRAD_ATOL * w.abs().max().item(),
                                   msg=lambda m, k=k: f"grad of {k}: {m}")


# ------------------------------------------------------------ fp32 conformance


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", MODELS)
def test_fp32_forward_and_gradients(name: str, train: bool) -> None:
    _assert_conformant(*_compare(name, train=train, padded=False), exact=name not in BUILTIN_ATTENTION)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", PADDABLE)
def test_fp32_forward_and_gradients_padded(name: str, train: bool) -> None:
    got, want = _compare(name, train=train, padded=True)
    _assert_conformant(got, want, exact=name not in BUILTIN_ATTENTION)
    # the pad must change something, or the padded case would test nothing new
    unpadded, _ = _compare(name, train=train, padded=False)
    assert not torch.allclose(got.y, unpadded.y, rtol=0, atol=1e-3)


# ------------------------------------------------------------ bf16 conformance


def _bf16_envelope(got: Tensor, real: Tensor, ref: Tensor) -> float:
    """Largest violation of ``|got - ref| <= 2 |real - ref| + atol``; <= 0 when it holds everywhere.

    bf16 keeps 8 significant bits, so one rounding at the output's largest
    magnitude moves it by up to 2^-8 ~ 0.4% of that magnitude. atol = 1% of
    max |ref| (about 2.5 such roundings) admits rounding in a different place
    than the real layer (the built-in attention's softmax is not the real
    eager one) but nothing systematic: a wrong norm or residual is off by
    tens of percent.
    """
    atol = 1e-2 * ref.abs().max()
    return ((got.float() - ref).abs() - 2 * (real.float() - ref).abs() - atol).max().item()


BF16_CASES = [(name, False) for name in MODELS] + [(name, True) for name in PADDABLE]


@pytest.mark.parametrize("name, padded", BF16_CASES)
def test_bf16_error_within_twice_the_real_layers(name: str, padded: bool) -> None:
    ref = R.BUILDERS[name]()
    real, m = _pair(name, train=False, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    x32, ctx32 = ref.make_inputs(padded=padded)
    x16, ctx16 = real.make_inputs(padded=padded)
    assert torch.equal(x16, x32.bfloat16())
    want = _run(ref.module, ref.reference, x32, ctx32, skip=ref.outside_keys)
    base = _run(real.module, real.reference, x16, ctx16, skip=real.outside_keys)
    got = _run(m, m, x16, ctx16)
    assert got.y.dtype == torch.bfloat16 and got.x_grad.dtype == torch.bfloat16
    assert (base.y.float() - want.y).abs().max() > 0  # bf16 really rounds: the bound is not 0 <= atol
    assert _bf16_envelope(got.y, base.y, want.y) <= 0
    assert _bf16_envelope(got.x_grad, base.x_grad, want.x_grad) <= 0


@pytest.mark.parametrize("name", [name for name in MODELS if name not in BUILTIN_ATTENTION])
def test_bf16_bit_exact_where_every_op_is_the_real_one(name: str) -> None:
    real, m = _pair(name, train=False, dtype=torch.bfloat16)
    x, ctx = real.make_inputs(padded=name in PADDABLE)
    _assert_conformant(_run(m, m, x, ctx), _run(real.module, real.reference, x, ctx), exact=True)


# ------------------------------------------------------------ the harness can fail


POST_LN_LLAMA = """
dim B: batch
dim S: seq
dim D: model = 64
dim F: hidden = 2 * D
dim H: heads = 4

block LlamaDecoderLayer(x: [B, S, D]) -> [B, S, D] {
  input_layernorm: rmsnorm(D, eps=1e-6, offset=0, cast=before_weight, accum=f32)
  self_attn: self_attention(heads=H, kv_heads=2, causal=true, rope=true, rope_theta=10000)
  post_attention_layernorm: rmsnorm(D, eps=1e-6, offset=0, cast=before_weight, accum=f32)
  mlp: gated_mlp(F, act=silu)
  h = input_layernorm(x + self_attn(x))
  y = post_attention_layernorm(h + mlp(h))
  return y
}
"""


def _wrong(name: str, program: Program, dtype: torch.dtype = torch.float32) -> tuple[Run, Run]:
    """Run a deliberately wrong program against the real layer it claims to describe."""
    real = R.BUILDERS[name](dtype=dtype)
    m = _compile(real, R.BUILDERS[name](dtype=dtype), program=program, dtype=dtype)
    x, ctx = real.make_inputs()
    return _run(m, m, x, ctx), _run(real.module, real.reference, x, ctx)


def _example_with(name: str, old: str, new: str) -> Program:
    example = R.EXAMPLES[name][0]
    text = (REPO / example).read_text()
    assert old in text
    return blockir.parse(text.replace(old, new), example)


def test_post_ln_llama_loads_strictly_but_fails() -> None:
    got, want = _wrong("LlamaDecoderLayer", blockir.parse(POST_LN_LLAMA))
    assert (got.y - want.y).abs().max() > 0.5
    with pytest.raises(AssertionError):
        _assert_conformant(got, want, exact=False)


def test_gemma2_without_the_norm_offset_fails() -> None:
    got, want = _wrong("Gemma2DecoderLayer", _example_with("Gemma2DecoderLayer", "offset=1", "offset=0"))
    assert (got.y - want.y).abs().max() > 0.5
    with pytest.raises(AssertionError):
        _assert_conformant(got, want, exact=False)


@pytest.mark.parametrize("name, old, new", [
    ("Gemma2DecoderLayer", "cast=after_weight", "cast=before_weight"),
    ("Olmo2DecoderLayer", "cast=after_weight", "cast=before_weight"),
])
def test_wrong_rmsnorm_cast_order_changes_bf16_rounding(name: str, old: str, new: str) -> None:
    """In fp32 the cast orders agree; in bf16 the neighbouring one no longer rounds like the real layer."""
    got, want = _wrong(name, _example_with(name, old, new), torch.bfloat16)
    assert not torch.equal(got.y, want.y)
    got32, want32 = _wrong(name, _example_with(name, old, new))
    _assert_conformant(got32, want32, exact=True)


# ------------------------------------------------------------ intermediates


def test_llama_trace_matches_a_step_by_step_reference() -> None:
    """Every SSA value of the printed LlamaDecoderLayer IR against the real submodules, one step at a time."""
    real = R.build_llama_decoder_layer()
    m = _compile(real, R.build_llama_decoder_layer())
    x, ctx = real.make_inputs(padded=True)
    L = real.module
    with torch.no_grad():
        ref_norm = L.input_layernorm(x)
        ref_attn = L.self_attn(ref_norm, position_embeddings=ctx["position_embeddings"],
                               attention_mask=ctx["attention_mask"])[0]
        ref_h = x + ref_attn
        ref_mlp_norm = L.post_attention_layernorm(ref_h)
        ref_mlp = L.mlp(ref_mlp_norm)
        ref_y = ref_h + ref_mlp
        y, values = blockir.trace(m, x, **ctx)
    assert set(values) == {"x", "%0", "%1", "h", "%2", "%3", "y"}
    expected = {"x": x, "%0": ref_norm, "%1": ref_attn, "h": ref_h, "%2": ref_mlp_norm, "%3": ref_mlp, "y": ref_y}
    for ssa, want in expected.items():
        torch.testing.assert_close(values[ssa], want, rtol=RTOL, atol=ATOL, msg=lambda m, s=ssa: f"{s}: {m}")
    # the norms are the real classes' arithmetic: bit for bit
    assert torch.equal(values["%0"], ref_norm)
    assert torch.equal(values["y"], y)


def test_llama_model_trace_per_layer_states() -> None:
    """``layers.i.y`` against the real layers run by hand and against HF's ``output_hidden_states``."""
    real = R.build_llama_model()
    m = _compile(real, R.build_llama_model())
    x, ctx = real.make_inputs(padded=True)
    model = real.module
    with torch.no_grad():
        out = model(inputs_embeds=x, attention_mask=ctx["attention_mask"], use_cache=False,
                    output_hidden_states=True)
        y, values = blockir.trace(m, x, **ctx)
        h = x
        for i, layer in enumerate(model.layers):
            assert values[f"layers.{i}.x"] is (values["x"] if i == 0 else values[f"layers.{i - 1}.y"])
            h = layer(h, attention_mask=ctx["attention_mask"], position_embeddings=ctx["position_embeddings"])
            torch.testing.assert_close(values[f"layers.{i}.y"], h, rtol=RTOL, atol=ATOL)
        final = model.norm(h)
    assert values["%0"] is values["layers.1.y"]
    torch.testing.assert_close(values["%1"], final, rtol=RTOL, atol=ATOL)
    assert torch.equal(values["%1"], y)
    # HF records the embeddings, each layer's output but the last, then the normed output
    embeds, layer0, normed = out.hidden_states
    assert torch.equal(embeds, x)
    torch.testing.assert_close(values["layers.0.y"], layer0, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(values["%1"], normed, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(values["%1"], out.last_hidden_state, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------ built-ins replace the real branches


def test_llama_builtins_need_no_binding_and_load_the_real_weights() -> None:
    real = R.build_llama_decoder_layer()
    assert real.bind == {}
    m = blockir.compile(real.example, real.block)
    m.load_state_dict(real.block_state_dict(), strict=True)
    m.eval()
    x, ctx = real.make_inputs()
    L = real.module
    with torch.no_grad():
        n = L.input_layernorm(x)
        torch.testing.assert_close(m.self_attn(n, **ctx), llama_attention(L.self_attn, n, **ctx),
                                   rtol=RTOL, atol=ATOL)
        assert torch.equal(m.mlp(n), L.mlp(n))
        assert type(m.self_attn) is not type(L.self_attn) and type(m.mlp) is not type(L.mlp)


@pytest.mark.parametrize("ctx_from", ["hf", "empty"])
def test_llama_builtin_attention_with_and_without_hf_rope(ctx_from: str) -> None:
    """With HF's (cos, sin) and causal mask in ctx, or with nothing: blockir builds RoPE and causality itself."""
    real = R.build_llama_decoder_layer()
    m = _compile(real, R.build_llama_decoder_layer())
    x, ctx = real.make_inputs()
    want = _run(real.module, real.reference, x, ctx)
    got = _run(m, m, x, ctx if ctx_from == "hf" else {})
    _assert_conformant(got, want, exact=False)


def test_llama_builtin_rope_tables_are_hfs() -> None:
    x, _ = R.build_llama_decoder_layer().make_inputs()
    rotary = LlamaRotaryEmbedding(config=R._llama_config(1))
    cos, sin = rope_cos_sin(R.S, R.HEAD_DIM, 10000.0, x.device, x.dtype)
    hf_cos, hf_sin = rotary(x, torch.arange(R.S)[None])
    torch.testing.assert_close(cos, hf_cos, rtol=0, atol=1e-7)
    torch.testing.assert_close(sin, hf_sin, rtol=0, atol=1e-7)


def test_llama_builtin_attention_takes_the_position_embeddings_from_ctx() -> None:
    """Positions 0, 2, 4, … change relative distances, so ignoring ctx's (cos, sin) would show."""
    real = R.build_llama_decoder_layer()
    m = _compile(real, R.build_llama_decoder_layer())
    x, ctx = real.make_inputs()
    position_ids = 2 * torch.arange(R.S)[None]
    strided = dict(ctx, position_ids=position_ids,
                   position_embeddings=LlamaRotaryEmbedding(config=R._llama_config(1))(x, position_ids))
    want = _run(real.module, real.reference, x, strided)
    got = _run(m, m, x, strided)
    _assert_conformant(got, want, exact=False)
    assert (got.y - _run(m, m, x, ctx).y).abs().max() > 1e-2


def test_llama_builtin_attention_honours_the_padding_mask_in_ctx() -> None:
    real = R.build_llama_decoder_layer()
    m = _compile(real, R.build_llama_decoder_layer())
    x, ctx = real.make_inputs(padded=True)
    with torch.no_grad():
        masked, unmasked = m(x, **ctx), m(x)
        torch.testing.assert_close(masked, real.reference(x, **ctx), rtol=RTOL, atol=ATOL)
    # row 1's last position is the pad; under the causal mask only that query could see it,
    # and with the pad hidden it attends to the other four positions only
    torch.testing.assert_close(masked[:, :-1], unmasked[:, :-1], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(masked[0], unmasked[0], rtol=RTOL, atol=ATOL)
    assert (masked[1, -1] - unmasked[1, -1]).abs().max() > 1e-2
