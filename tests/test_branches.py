"""Built-in branches against HF LLaMA modules and hand-written attention/MLP references."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRotaryEmbedding

from blockir.lower.layers.attention import CrossAttention, SelfAttention
from blockir.lower.layers.branches import BRANCH_KINDS
from blockir.lower.layers.mlp import MLP, GatedMLP
from blockir.lower.layers.moe import MoE
from blockir.lower.layers.rotary import rope_cos_sin

B, S, D, H, KV, F_HIDDEN = 2, 7, 64, 4, 2, 128
TOL = {"rtol": 1e-5, "atol": 1e-6}


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _config(attn: str = "sdpa", **overrides: object) -> LlamaConfig:
    config = LlamaConfig(
        hidden_size=D,
        intermediate_size=F_HIDDEN,
        num_attention_heads=H,
        num_key_value_heads=KV,
        num_hidden_layers=1,
        vocab_size=32,
        **overrides,
    )
    config._attn_implementation = attn
    return config


def _hf_pair(config: LlamaConfig, **kwargs: object) -> tuple[LlamaAttention, SelfAttention]:
    torch.manual_seed(0)
    hf = LlamaAttention(config, layer_idx=0).eval()
    ours = SelfAttention(D, H, KV, rope=True, causal=True, **kwargs)
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours


def _hf_rope(config: LlamaConfig, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    position_ids = torch.arange(x.shape[1]).expand(x.shape[0], -1)
    return LlamaRotaryEmbedding(config)(x, position_ids)


def _additive_causal(seq: int) -> torch.Tensor:
    return torch.full((seq, seq), torch.finfo(torch.float32).min).triu(1)[None, None]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_self_attention_matches_llama_attention(attn: str) -> None:
    config = _config(attn)
    hf, ours = _hf_pair(config)
    x = _x(B, S, D)
    rope = _hf_rope(config, x)
    # HF's eager path has no implicit causality: its mask must be passed in
    hf_mask = _additive_causal(S) if attn == "eager" else None
    expected, _ = hf(x, position_embeddings=rope, attention_mask=hf_mask)
    torch.testing.assert_close(ours(x, position_embeddings=rope), expected, **TOL)
    torch.testing.assert_close(ours(x), expected, **TOL)


def test_internal_rope_tables_equal_hf_rotary_embedding() -> None:
    config = _config(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    x = _x(1, S, D)
    cos, sin = _hf_rope(config, x)
    ours_cos, ours_sin = rope_cos_sin(S, D // H, 500000.0, x.device, x.dtype)
    assert torch.equal(ours_cos, cos) and torch.equal(ours_sin, sin)


def test_rope_theta_reaches_the_forward() -> None:
    config = _config(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    hf, ours = _hf_pair(config, rope_theta=500000.0)
    x = _x(B, S, D, seed=1)
    expected, _ = hf(x, position_embeddings=_hf_rope(config, x), attention_mask=None)
    torch.testing.assert_close(ours(x), expected, **TOL)
    default_theta = SelfAttention(D, H, KV, rope=True)
    default_theta.load_state_dict(ours.state_dict())
    assert not torch.allclose(default_theta(x), expected, **TOL)


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_self_attention_padding_mask_matches_hf(mask_kind: str) -> None:
    config = _config("sdpa")
    hf, ours = _hf_pair(config)
    x = _x(B, S, D, seed=2)
    allowed = torch.ones(S, S, dtype=torch.bool).tril()[None, None].repeat(B, 1, 1, 1)
    allowed[1, :, :, :2] = False  # left padding of the second sample
    allowed[1, :, :2, 0] = True  # padded rows still see something, avoiding all -inf rows
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    mask = allowed if mask_kind == "bool" else additive
    rope = _hf_rope(config, x)
    expected, _ = hf(x, position_embeddings=rope, attention_mask=mask)
    got = ours(x, position_embeddings=rope, attention_mask=mask)
    torch.testing.assert_close(got, expected, **TOL)
    unmasked = ours(x, position_embeddings=rope)
    assert not torch.allclose(got[1], unmasked[1], **TOL)
    torch.testing.assert_close(got[0], unmasked[0], **TOL)


def test_self_attention_gradients_match_hf() -> None:
    config = _config("sdpa")
    hf, ours = _hf_pair(config)
    x = _x(B, S, D, seed=3)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    hf(x_hf, position_embeddings=_hf_rope(config, x), attention_mask=None)[0].square().sum().backward()
    ours(x_ours).square().sum().backward()
    torch.testing.assert_close(x_ours.grad, x_hf.grad, **TOL)
    for name, param in ours.named_parameters():
        torch.testing.assert_close(param.grad, hf.get_parameter(name).grad, rtol=1e-5, atol=1e-5)


def test_self_attention_causality_and_unknown_context() -> None:
    attn = SelfAttention(D, H, KV, rope=True, causal=True)
    x = _x(B, S, D, seed=4)
    y = x.clone()
    y[:, -1] += 5.0
    torch.testing.assert_close(attn(y)[:, :-1], attn(x)[:, :-1], **TOL)
    bidirectional = SelfAttention(D, H, KV, rope=True, causal=False)
    bidirectional.load_state_dict(attn.state_dict())
    assert not torch.allclose(bidirectional(y)[:, :-1], bidirectional(x)[:, :-1], **TOL)
    assert torch.equal(attn(x, memory=x, memory_mask=None, step=3), attn(x))


def test_gqa_shapes_and_head_grouping() -> None:
    grouped = SelfAttention(D, H, KV, rope=True)
    hd = D // H
    assert grouped.q_proj.weight.shape == (H * hd, D)
    assert grouped.k_proj.weight.shape == grouped.v_proj.weight.shape == (KV * hd, D)
    assert grouped.o_proj.weight.shape == (D, H * hd)
    x = _x(B, S, D, seed=5)
    assert grouped(x).shape == (B, S, D)
    # query head h reads kv head h // (H // KV): duplicating kv heads that way gives full MHA
    full = SelfAttention(D, H, H, rope=True)
    state = grouped.state_dict()
    for name in ("k_proj.weight", "v_proj.weight"):
        state[name] = state[name].view(KV, hd, D).repeat_interleave(H // KV, dim=0).reshape(H * hd, D)
    full.load_state_dict(state, strict=True)
    torch.testing.assert_close(full(x), grouped(x), **TOL)


def test_explicit_head_dim_matches_hf() -> None:
    config = _config("sdpa", head_dim=8)
    torch.manual_seed(0)
    hf = LlamaAttention(config, layer_idx=0).eval()
    ours = SelfAttention(D, H, KV, head_dim=8, rope=True)
    ours.load_state_dict(hf.state_dict(), strict=True)
    x = _x(B, S, D, seed=6)
    expected, _ = hf(x, position_embeddings=_hf_rope(config, x), attention_mask=None)
    torch.testing.assert_close(ours(x), expected, **TOL)


def test_invalid_head_layouts() -> None:
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        SelfAttention(D, 4, 3)
    with pytest.raises(ValueError, match="head_dim"):
        SelfAttention(60, 8)
    with pytest.raises(ValueError, match="activation"):
        MLP(D, F_HIDDEN, act="swish9")


def _reference_cross_attention(
    m: CrossAttention, x: torch.Tensor, memory: torch.Tensor, allowed: torch.Tensor | None
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(hd)) V one head at a time, query head h reading kv head h // groups."""
    hd, groups = m.head_dim, m.heads // m.kv_heads
    q = x @ m.q_proj.weight.T
    k = memory @ m.k_proj.weight.T
    v = memory @ m.v_proj.weight.T
    heads = []
    for h in range(m.heads):
        g = h // groups
        qh = q[..., h * hd : (h + 1) * hd]
        kh, vh = k[..., g * hd : (g + 1) * hd], v[..., g * hd : (g + 1) * hd]
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(hd)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ vh)
    return torch.cat(heads, dim=-1) @ m.o_proj.weight.T


@pytest.mark.parametrize("kv_heads", [H, KV])
def test_cross_attention_matches_reference(kv_heads: int) -> None:
    torch.manual_seed(1)
    m = CrossAttention(D, H, kv_heads)
    x, memory = _x(B, 5, D, seed=7), _x(B, 9, D, seed=8)
    torch.testing.assert_close(m(x, memory), _reference_cross_attention(m, x, memory, None), **TOL)
    allowed = torch.ones(B, 1, 9, dtype=torch.bool)
    allowed[0, :, 6:] = False  # padded memory positions of the first sample
    got = m(x, memory, memory_mask=allowed[:, None], attention_mask=torch.zeros(1))
    torch.testing.assert_close(got, _reference_cross_attention(m, x, memory, allowed), **TOL)


def test_mlp_matches_reference() -> None:
    torch.manual_seed(2)
    m = MLP(D, F_HIDDEN)
    assert set(m.state_dict()) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    x = _x(B, S, D, seed=9)
    h = x @ m.fc1.weight.T + m.fc1.bias
    expected = (0.5 * h * (1 + torch.erf(h / math.sqrt(2)))) @ m.fc2.weight.T + m.fc2.bias
    torch.testing.assert_close(m(x, position_embeddings=None), expected, **TOL)
    relu = MLP(D, F_HIDDEN, act="relu", bias=False)
    assert set(relu.state_dict()) == {"fc1.weight", "fc2.weight"}
    torch.testing.assert_close(relu(x), torch.relu(x @ relu.fc1.weight.T) @ relu.fc2.weight.T, **TOL)


def test_gated_mlp_matches_llama_mlp() -> None:
    torch.manual_seed(3)
    hf = LlamaMLP(_config())
    ours = GatedMLP(D, F_HIDDEN)
    ours.load_state_dict(hf.state_dict(), strict=True)
    x = _x(B, S, D, seed=10)
    torch.testing.assert_close(ours(x, attention_mask=None), hf(x), **TOL)
    gate, up = x @ ours.gate_proj.weight.T, x @ ours.up_proj.weight.T
    torch.testing.assert_close(ours(x), (gate * torch.sigmoid(gate) * up) @ ours.down_proj.weight.T, **TOL)


def test_branch_kinds_registry() -> None:
    assert BRANCH_KINDS == {
        "self_attention": SelfAttention,
        "cross_attention": CrossAttention,
        "mlp": MLP,
        "gated_mlp": GatedMLP,
        "moe": MoE,
    }
    assert all(issubclass(kind, nn.Module) for kind in BRANCH_KINDS.values())
