"""The reference builders and adapters, checked against the real layers by hand.

Each test writes a layer's block equation in plain torch from the real
submodules and the adapters, and requires it to equal ``reference`` in fp32:
this pins down both the adapters and the equations of the example ``.block``
files. Further tests pin the norm cast orders the examples declare and check
that every declaration of the examples names real parameters.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from blockir.lower import adapters as A

from . import real_models as R

ATOL = 1e-6
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_grad() -> Any:
    with torch.no_grad():
        yield


def _drop(u: Tensor, p: float, module: nn.Module) -> Tensor:
    # where the block writes dropout(u, p=...); identity in eval as in the real layer
    return F.dropout(u, p, training=module.training)


def _check(real: R.RealLayer, compose: Callable[..., Tensor], **input_kwargs: Any) -> None:
    x, ctx = real.make_inputs(**input_kwargs)
    want = real.reference(x, **ctx)
    got = compose(x, **ctx)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


# ------------------------------------------------------------ hand composition


def _llama_mlp(mlp: nn.Module, n: Tensor, act: Callable[[Tensor], Tensor]) -> Tensor:
    # the built-in gated_mlp: down(act(gate(n)) * up(n))
    return mlp.down_proj(act(mlp.gate_proj(n)) * mlp.up_proj(n))


def _llama_layer(layer: nn.Module, x: Tensor, **ctx: Any) -> Tensor:
    h = x + A.llama_attention(layer.self_attn, layer.input_layernorm(x), **ctx)
    return h + _llama_mlp(layer.mlp, layer.post_attention_layernorm(h), F.silu)


@pytest.mark.parametrize("padded", [False, True])
def test_llama_decoder_layer(padded: bool) -> None:
    real = R.build_llama_decoder_layer()
    _check(real, lambda x, **ctx: _llama_layer(real.module, x, **ctx), padded=padded)


def _rope(t: Tensor, theta: float = 10000.0) -> Tensor:
    """Rotate-half RoPE on [B, heads, S, hd] at positions 0..S-1, from scratch."""
    hd = t.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = torch.arange(t.shape[-2], dtype=torch.float32)[:, None] * inv
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    rot = torch.cat([-t[..., hd // 2:], t[..., : hd // 2]], -1)
    return t * cos + rot * sin


def _self_attention(attn: nn.Module, n: Tensor, heads: int, kv_heads: int) -> Tensor:
    """What ``self_attention(heads, kv_heads, causal=true, rope=true)`` must compute."""
    b, s, _ = n.shape
    split = lambda t, h: t.view(b, s, h, -1).transpose(1, 2)  # noqa: E731
    q = _rope(split(attn.q_proj(n), heads))
    k = _rope(split(attn.k_proj(n), kv_heads)).repeat_interleave(heads // kv_heads, dim=1)
    v = split(attn.v_proj(n), kv_heads).repeat_interleave(heads // kv_heads, dim=1)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    out = scores.softmax(-1) @ v
    return attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))


def test_llama_builtin_self_attention_semantics() -> None:
    """The built-in declared in llama.block (GQA 4/2, causal, RoPE theta 1e4) is LlamaAttention."""
    real = R.build_llama_decoder_layer()
    layer = real.module

    def compose(x: Tensor, **ctx: Any) -> Tensor:
        h = x + _self_attention(layer.self_attn, layer.input_layernorm(x), R.H, R.KV)
        return h + _llama_mlp(layer.mlp, layer.post_attention_layernorm(h), F.silu)

    _check(real, compose)


@pytest.mark.parametrize("padded", [False, True])
def test_llama_model_is_layers_then_norm(padded: bool) -> None:
    real = R.build_llama_model()
    model = real.module

    def compose(x: Tensor, **ctx: Any) -> Tensor:
        for layer in model.layers:
            x = _llama_layer(layer, x, **ctx)
        return model.norm(x)

    _check(real, compose, padded=padded)


def test_llama_model_reference_matches_2d_mask_and_real_layers() -> None:
    """Passing the prepared 4D mask is the same as letting LlamaModel build it."""
    real = R.build_llama_model()
    model = real.module
    x, ctx = real.make_inputs(padded=True)
    mask_2d = torch.ones(R.B, R.S, dtype=torch.long)
    mask_2d[1, -1] = 0
    from_2d = model(inputs_embeds=x, attention_mask=mask_2d, use_cache=False).last_hidden_state
    torch.testing.assert_close(real.reference(x, **ctx), from_2d, atol=0, rtol=0)
    h = x
    for layer in model.layers:
        h = layer(h, attention_mask=ctx["attention_mask"], position_embeddings=ctx["position_embeddings"])
    torch.testing.assert_close(model.norm(h), from_2d, atol=0, rtol=0)


@pytest.mark.parametrize("padded", [False, True])
def test_gpt2_block(padded: bool) -> None:
    real = R.build_gpt2_block()
    blk = real.module

    def compose(x: Tensor, **ctx: Any) -> Tensor:
        h = x + A.gpt2_attention(blk.attn, blk.ln_1(x), **ctx)
        return h + A.gpt2_mlp(blk.mlp, blk.ln_2(h), **ctx)

    _check(real, compose, padded=padded)


def test_gpt2_attention_needs_the_mask_for_causality() -> None:
    real = R.build_gpt2_block()
    x, ctx = real.make_inputs()
    n = real.module.ln_1(x)
    masked = A.gpt2_attention(real.module.attn, n, **ctx)
    unmasked = A.gpt2_attention(real.module.attn, n)
    assert not torch.allclose(masked[:, :-1], unmasked[:, :-1])
    torch.testing.assert_close(masked[:, -1], unmasked[:, -1])  # the last row sees everything anyway


@pytest.mark.parametrize("padded", [False, True])
def test_bert_layer(padded: bool) -> None:
    real = R.build_bert_layer()
    L = real.module

    def compose(x: Tensor, **ctx: Any) -> Tensor:
        a = A.bert_self_attention(L.attention.self, x, **ctx)
        h = L.attention.output.LayerNorm(x + _drop(L.attention.output.dense(a), 0.1, L))
        i = F.gelu(L.intermediate.dense(h))
        return L.output.LayerNorm(h + _drop(L.output.dense(i), 0.1, L))

    _check(real, compose, padded=padded)


@pytest.mark.parametrize("padded", [False, True])
def test_gpt_neox_layer(padded: bool) -> None:
    real = R.build_gpt_neox_layer()
    L = real.module

    def compose(x: Tensor, **ctx: Any) -> Tensor:
        a = _drop(A.gpt_neox_attention(L.attention, L.input_layernorm(x), **ctx), 0.0, L)
        m = _drop(A.gpt_neox_mlp(L.mlp, L.post_attention_layernorm(x), **ctx), 0.0, L)
        return m + a + x

    _check(real, compose, padded=padded)


def _gemma2_compose(L: nn.Module) -> Callable[..., Tensor]:
    def compose(x: Tensor, **ctx: Any) -> Tensor:
        h = x + L.post_attention_layernorm(A.gemma2_attention(L.self_attn, L.input_layernorm(x), **ctx))
        gelu_tanh = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
        return h + L.post_feedforward_layernorm(_llama_mlp(L.mlp, L.pre_feedforward_layernorm(h), gelu_tanh))

    return compose


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("softcap", [None, 50.0])
def test_gemma2_decoder_layer(padded: bool, softcap: float | None) -> None:
    real = R.build_gemma2_decoder_layer(attn_logit_softcapping=softcap)
    _check(real, _gemma2_compose(real.module), padded=padded)


def test_gemma2_attention_takes_per_layer_type_masks() -> None:
    real = R.build_gemma2_decoder_layer()
    x, ctx = real.make_inputs(padded=True)
    by_type = dict(ctx, attention_mask={"full_attention": ctx["attention_mask"], "sliding_attention": None})
    torch.testing.assert_close(_gemma2_compose(real.module)(x, **by_type), real.reference(x, **ctx),
                               atol=0, rtol=0)


@pytest.mark.parametrize("padded", [False, True])
def test_olmo2_decoder_layer(padded: bool) -> None:
    real = R.build_olmo2_decoder_layer()
    L = real.module

    def compose(x: Tensor, **ctx: Any) -> Tensor:
        h = x + L.post_attention_layernorm(A.olmo2_attention(L.self_attn, x, **ctx))
        return h + L.post_feedforward_layernorm(_llama_mlp(L.mlp, h, F.silu))

    _check(real, compose, padded=padded)


def test_t5_layer_ff() -> None:
    real = R.build_t5_layer_ff()
    L = real.module

    def compose(x: Tensor, **ctx: Any) -> Tensor:
        return x + _drop(A.t5_dense_relu_dense(L.DenseReluDense, L.layer_norm(x), **ctx), 0.1, L)

    _check(real, compose)
    # and the bound module itself is wo(dropout(relu(wi(n))))
    x, _ = real.make_inputs()
    n = L.layer_norm(x)
    drd = L.DenseReluDense
    torch.testing.assert_close(drd(n), drd.wo(_drop(F.relu(drd.wi(n)), 0.1, L)), atol=0, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("masks", [{}, {"padded": True}, {"padded": True, "causal": True}])
def test_transformer_encoder_layer(norm_first: bool, masks: dict[str, bool]) -> None:
    real = R.build_transformer_encoder_layer(norm_first=norm_first)
    L = real.module

    def ff(n: Tensor) -> Tensor:
        return _drop(L.linear2(_drop(F.relu(L.linear1(n)), 0.1, L)), 0.1, L)

    def compose(x: Tensor, **ctx: Any) -> Tensor:
        with R.mha_fastpath(False):
            if norm_first:
                h = x + _drop(A.multihead_attention(L.self_attn, L.norm1(x), **ctx), 0.1, L)
                return h + ff(L.norm2(h))
            h = L.norm1(x + _drop(A.multihead_attention(L.self_attn, x, **ctx), 0.1, L))
            return L.norm2(h + ff(h))

    _check(real, compose, **masks)


def test_transformer_encoder_fastpath_stays_close() -> None:
    """Outside the reference, torch's fused inference path may differ in the last bits only."""
    real = R.build_transformer_encoder_layer()
    x, ctx = real.make_inputs(padded=True)
    fused = real.module(x, **ctx)
    torch.testing.assert_close(fused, real.reference(x, **ctx), atol=2e-6, rtol=0)


# ------------------------------------------------------------ adapter contract


ALL = sorted(R.BUILDERS)


@pytest.mark.parametrize("name", ALL)
def test_bind_names_are_real_submodules(name: str) -> None:
    real = R.BUILDERS[name]()
    for decl, (module, adapter) in real.bind.items():
        assert real.module.get_submodule(decl) is module
        assert adapter is A.adapter_for(module)


@pytest.mark.parametrize("name", ALL)
def test_adapters_ignore_unknown_ctx(name: str) -> None:
    real = R.BUILDERS[name]()
    x, ctx = real.make_inputs()
    for module, adapter in real.bind.values():
        plain = adapter(module, x, **ctx)
        noisy = adapter(module, x, **ctx, unknown_key=object(), cache=None, output_attentions=True)
        torch.testing.assert_close(noisy, plain, atol=0, rtol=0)


@pytest.mark.parametrize("name", ALL)
def test_builders_are_deterministic_and_norms_moved(name: str) -> None:
    a, b = R.BUILDERS[name](), R.BUILDERS[name]()
    sa, sb = a.module.state_dict(), b.module.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    for mod_name, mod in a.module.named_modules():
        if "Norm" in type(mod).__name__:
            w = mod.weight
            assert not torch.allclose(w, torch.ones_like(w)) and not torch.allclose(w, torch.zeros_like(w)), mod_name


def test_bf16_builders_run() -> None:
    for name in ("LlamaDecoderLayer", "Gemma2DecoderLayer", "T5LayerFF"):
        real = R.BUILDERS[name](dtype=torch.bfloat16)
        x, ctx = real.make_inputs(padded=True)
        assert x.dtype == torch.bfloat16
        assert torch.isfinite(real.reference(x, **ctx).float()).all()


# ------------------------------------------------------------ norm cast orders


def _rmsnorm(x: Tensor, w: Tensor, eps: float, offset: int, cast: str) -> Tensor:
    """The rmsnorm declarations of the examples, spelled out (accum=f32)."""
    xf = x.float()
    r = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if cast == "before_weight":
        return (offset + w) * r.to(x.dtype)
    if cast == "after_weight":
        return (r * (offset + w.float())).to(x.dtype)
    assert cast == "weight_dtype"
    if w.dtype in (torch.float16, torch.bfloat16):
        r = r.to(w.dtype)
    return (offset + w) * r


NORMS = {
    # real norm owner -> (builder, submodule, eps, offset, cast) as the examples declare them
    "llama": ("LlamaDecoderLayer", "input_layernorm", 1e-6, 0, "before_weight"),
    "gemma2": ("Gemma2DecoderLayer", "post_attention_layernorm", 1e-6, 1, "after_weight"),
    "olmo2": ("Olmo2DecoderLayer", "post_feedforward_layernorm", 1e-5, 0, "after_weight"),
    "t5": ("T5LayerFF", "layer_norm", 1e-6, 0, "weight_dtype"),
}


@pytest.mark.parametrize("which", sorted(NORMS))
def test_rmsnorm_cast_orders_in_bf16(which: str) -> None:
    builder, sub, eps, offset, cast = NORMS[which]
    real = R.BUILDERS[builder](dtype=torch.bfloat16)
    norm = real.module.get_submodule(sub)
    x, _ = real.make_inputs()
    x = x * 7  # larger magnitudes make the rounding of each cast order visible
    want = norm(x)
    got = _rmsnorm(x, norm.weight, eps, offset, cast)
    assert got.dtype == want.dtype
    assert torch.equal(got, want)
    if cast == "weight_dtype":
        return  # same as before_weight when weight and input share a dtype; see the next test
    # the neighbouring cast order rounds differently, so a wrong declaration shows
    other = "after_weight" if cast == "before_weight" else "before_weight"
    assert not torch.equal(_rmsnorm(x, norm.weight, eps, offset, other), want), other


def test_t5_norm_output_follows_weight_dtype() -> None:
    """With f32 weights and bf16 input T5LayerNorm never rounds to bf16 and returns f32."""
    real = R.build_t5_layer_ff()
    norm = real.module.layer_norm
    x, _ = real.make_inputs()
    x = (x * 7).bfloat16()
    want = norm(x)
    assert want.dtype == torch.float32
    assert torch.equal(_rmsnorm(x, norm.weight, 1e-6, 0, "weight_dtype"), want)
    assert not torch.equal(_rmsnorm(x, norm.weight, 1e-6, 0, "before_weight"), want)


# ------------------------------------------------------------ example drafts


def _block_decls(example: str, block: str) -> tuple[dict[str, Any], dict[str, Any]]:
    parser = pytest.importorskip("blockir.frontend.parser")
    path = REPO / example
    program = parser.parse_ast(path.read_text(), str(path))
    blocks = {item.name: item for item in program.items if hasattr(item, "body")}
    return {s.name: s for s in blocks[block].body if type(s).__name__ == "DeclAst"}, blocks


BUILTIN_KEYS = {
    "self_attention": ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"),
    "gated_mlp": ("gate_proj.weight", "up_proj.weight", "down_proj.weight"),
}


def _flag(decl: Any, name: str, default: bool) -> bool:
    for kw in decl.kwargs:
        if kw.name == name:
            return getattr(kw.value, "name", None) == "true"  # true / false parse as references
    return default


def _expected_keys(example: str, block: str, prefix: str = "") -> set[str]:
    """The state_dict keys the declarations of ``block`` promise, built-ins by name."""
    decls, blocks = _block_decls(example, block)
    keys: set[str] = set()
    for name, d in decls.items():
        p = f"{prefix}{name}."
        if d.count is not None:  # `layers: Block * N`
            for i in range(int(d.count.value)):
                keys |= _expected_keys(example, d.kind, f"{p}{i}.")
        elif d.kind in BUILTIN_KEYS:
            keys |= {p + k for k in BUILTIN_KEYS[d.kind]}
        elif d.kind in ("linear", "layernorm"):
            keys |= {p + "weight"} | ({p + "bias"} if _flag(d, "bias", True) else set())
        elif d.kind == "rmsnorm":
            keys.add(p + "weight")
        elif d.extern_params is not None:
            keys.add(p + "*")  # whatever the bound module owns
    return keys


@pytest.mark.parametrize("name", ALL)
def test_example_declarations_cover_real_keys(name: str) -> None:
    real = R.BUILDERS[name]()
    assert (real.example, real.block) == R.EXAMPLES[name]
    promised = _expected_keys(real.example, real.block)
    extern = {k[:-1] for k in promised if k.endswith("*")}
    actual = set(real.block_state_dict())
    covered = {k for k in actual if any(k.startswith(e) for e in extern)}
    assert actual - covered == promised - {e + "*" for e in extern}
    assert {e.rstrip(".") for e in extern} == set(real.bind)
