"""The built-in attention reads the masks HF models and torch.nn layers pass, and keeps its causality.

Every accepted form is compared with the real module given the equivalent mask, on the rows that are
not padding (a padded query has nothing it may attend to; what it computes is each kernel's choice).
"""
from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import blockir
from blockir.lower.layers.attention import CrossAttention, SelfAttention
from conformance import real_models as R
from conftest import ROOT

RTOL, ATOL = 1e-5, 1e-5
LOW = torch.finfo(torch.float32).min


def _keep() -> Tensor:
    """HF 2D mask, 1 = real token: row 0 is left-padded by two, row 1 right-padded by one."""
    keep = torch.ones(R.B, R.S, dtype=torch.long)
    keep[0, :2] = 0
    keep[1, -1] = 0
    return keep


def _close_on_tokens(got: Tensor, want: Tensor, keep: Tensor) -> None:
    rows = keep.bool()
    torch.testing.assert_close(got[rows], want[rows], rtol=RTOL, atol=ATOL)


def _llama() -> tuple[nn.Module, R.RealLayer]:
    real = R.build_llama_model()
    m = blockir.compile(ROOT / real.example, real.block).eval()
    m.load_state_dict(real.block_state_dict(), strict=True)
    return m, real


def _forms(keep: Tensor) -> dict[str, dict[str, Tensor]]:
    """The same padding in every form the built-in reads; none of them states the causality."""
    keys = keep.bool()[:, None, None, :].expand(R.B, 1, R.S, R.S)
    return {
        "keep_int64": {"attention_mask": keep},
        "keep_bool": {"attention_mask": keep.bool()},
        "bool_4d": {"attention_mask": keys},
        "additive_4d": {"attention_mask": torch.zeros(keys.shape).masked_fill(~keys, LOW)},
        "torch_key_padding": {"src_key_padding_mask": keep == 0},
        "torch_additive_key_padding": {"src_key_padding_mask": torch.zeros(R.B, R.S).masked_fill(keep == 0, LOW)},
    }


@pytest.mark.parametrize("form", list(_forms(_keep())))
def test_padding_forms_combine_with_causality_like_llama_model(form: str) -> None:
    m, real = _llama()
    x, keep = R._x(0, torch.float32), _keep()
    with torch.no_grad():
        want = real.module(inputs_embeds=x, attention_mask=keep, use_cache=False).last_hidden_state
        got = m(x, **_forms(keep)[form])
        unmasked = m(x)
    _close_on_tokens(got, want, keep)
    assert (got[0, 2:] - unmasked[0, 2:]).abs().max() > 1e-2  # the left padding was hidden


def test_hf_causal_mask_as_the_model_builds_it() -> None:
    m, real = _llama()
    x, keep = R._x(1, torch.float32), _keep()
    hf_mask = R._causal_ctx(R._llama_config(2), None, x, padded=False)["attention_mask"]
    with torch.no_grad():
        want = real.module(inputs_embeds=x, attention_mask=keep, use_cache=False).last_hidden_state
        # HF's eager mask with the padding folded in, and both at once: each constraint holds
        padded = hf_mask.masked_fill(keep[:, None, None, :] == 0, LOW)
        _close_on_tokens(m(x, attention_mask=padded), want, keep)
        _close_on_tokens(m(x, attention_mask=hf_mask, src_key_padding_mask=keep == 0), want, keep)


def test_a_mask_without_causality_does_not_lift_it() -> None:
    attn = SelfAttention(R.D, R.H, causal=True)
    x = R._x(2, torch.float32)
    everything = torch.ones(R.B, 1, R.S, R.S, dtype=torch.bool)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, attention_mask=everything), attn(x), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(attn(x, attention_mask=torch.zeros(R.B, 1, R.S, R.S)), attn(x),
                                   rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(attn(x, attention_mask=torch.ones(R.B, R.S, dtype=torch.long)), attn(x),
                                   rtol=RTOL, atol=ATOL)


def _mha_pair(cls: type[SelfAttention] | type[CrossAttention], **kw: object
              ) -> tuple[nn.MultiheadAttention, nn.Module]:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(R.D, R.H, batch_first=True)
    ours = cls(R.D, R.H, bias=True, out_bias=True, **kw)
    q, k, v = mha.in_proj_weight.chunk(3)
    qb, kb, vb = mha.in_proj_bias.chunk(3)
    ours.load_state_dict({"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v, "q_proj.bias": qb,
                          "k_proj.bias": kb, "v_proj.bias": vb, "o_proj.weight": mha.out_proj.weight,
                          "o_proj.bias": mha.out_proj.bias}, strict=True)
    return mha, ours


def test_self_attention_matches_multihead_attention_with_key_padding() -> None:
    mha, ours = _mha_pair(SelfAttention, causal=False)
    x, keep = R._x(3, torch.float32), _keep()
    pad = keep == 0
    with torch.no_grad(), R.mha_fastpath(False):
        want, _ = mha(x, x, x, key_padding_mask=pad, need_weights=False)
        for ctx in ({"src_key_padding_mask": pad}, {"attention_mask": keep}):
            torch.testing.assert_close(ours(x, **ctx), want, rtol=RTOL, atol=ATOL)


def test_cross_attention_matches_multihead_attention_over_padded_memory() -> None:
    mha, ours = _mha_pair(CrossAttention)
    x, memory = R._x(4, torch.float32)[:, :3], R._x(5, torch.float32)
    keep = _keep()
    pad = keep == 0
    with torch.no_grad(), R.mha_fastpath(False):
        want, _ = mha(x, memory, memory, key_padding_mask=pad, need_weights=False)
        additive = torch.zeros(R.B, 1, 1, R.S).masked_fill(pad[:, None, None, :], LOW)
        for ctx in ({"memory_key_padding_mask": pad}, {"memory_mask": keep}, {"memory_mask": additive},
                    {"memory_mask": ~pad[:, None, None, :]}):
            torch.testing.assert_close(ours(x, memory, **ctx), want, rtol=RTOL, atol=ATOL)


ENCODER = """dim B: batch
dim S: seq
dim D: model = 64
dim F: hidden = 2 * D
block Encoder(x: [B, S, D]) -> [B, S, D] {
  self_attn: self_attention(heads=4, causal=false, bias=true, out_bias=true)
  linear1: linear(D, F, bias=true)
  linear2: linear(F, D, bias=true)
  norm1: layernorm(D, eps=1e-5, bias=true)
  norm2: layernorm(D, eps=1e-5, bias=true)
  h = norm1(x + self_attn(x))
  y = norm2(h + linear2(relu(linear1(h))))
  return y
}
"""


def test_encoder_block_matches_transformer_encoder_layer_given_the_same_ctx() -> None:
    real = R.build_transformer_encoder_layer()
    state = dict(real.module.state_dict())
    for name, w in zip("qkv", state.pop("self_attn.in_proj_weight").chunk(3)):
        state[f"self_attn.{name}_proj.weight"] = w
    for name, b in zip("qkv", state.pop("self_attn.in_proj_bias").chunk(3)):
        state[f"self_attn.{name}_proj.bias"] = b
    state["self_attn.o_proj.weight"] = state.pop("self_attn.out_proj.weight")
    state["self_attn.o_proj.bias"] = state.pop("self_attn.out_proj.bias")
    m = blockir.compile(blockir.parse(ENCODER), "Encoder").eval()
    m.load_state_dict(state, strict=True)
    x, ctx = real.make_inputs(seed=6, padded=True)
    keep = (~ctx["src_key_padding_mask"]).long()
    with torch.no_grad():
        want = real.reference(x, **ctx)
        _close_on_tokens(m(x, **ctx), want, keep)
        _close_on_tokens(m(x, attention_mask=keep), want, keep)


REFUSED = {
    "float_2d": (torch.zeros(R.B, R.S), "shape [2, 5] and dtype torch.float32"),
    "int_4d": (torch.ones(R.B, 1, R.S, R.S, dtype=torch.long), "shape [2, 1, 5, 5] and dtype torch.int64"),
    "3d": (torch.ones(R.B * R.H, R.S, R.S, dtype=torch.bool), "shape [8, 5, 5] and dtype torch.bool"),
    "wrong_keys": (torch.ones(R.B, R.S + 1, dtype=torch.long), "shape [2, 6] and dtype torch.int64"),
    "wrong_batch": (torch.ones(3, R.S, dtype=torch.long), "shape [3, 5] and dtype torch.int64"),
    "list": ([[1, 1, 1, 1, 1]] * R.B, "type list"),
    "per_layer_dict": ({"full_attention": None}, "type dict"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unreadable_masks_are_e0723_at_the_declaration(case: str) -> None:
    mask, form = REFUSED[case]
    m = blockir.compile(ROOT / "examples" / "llama.block", "LlamaDecoderLayer", dims={"D": 64})
    with pytest.raises(blockir.BlockError) as info:
        m(R._x(0, torch.float32), attention_mask=mask)
    (d,) = info.value.diagnostics
    assert d.code == "E0723"
    assert d.message == f"self_attention 'self_attn': attention_mask of {form} is not a mask it reads"
    assert (d.span.filename, d.span.line) == (str(ROOT / "examples" / "llama.block"), 26)
    assert d.hint.startswith("accepted: [B, K] bool or integer keep-mask (1 = attend)")


def test_unreadable_key_padding_is_e0723() -> None:
    attn = SelfAttention(R.D, R.H)
    with pytest.raises(blockir.BlockError) as info:
        attn(R._x(0, torch.float32), src_key_padding_mask=torch.ones(R.B, R.S, dtype=torch.long))
    (d,) = info.value.diagnostics
    assert d.message == ("self_attention: src_key_padding_mask of shape [2, 5] and dtype torch.int64 "
                         "is not a mask it reads")
    assert d.hint == "accepted: [B, K] bool (True = padded key, torch's convention) or float added to the scores"


def test_queries_at_given_positions_get_those_rows_of_the_whole_mask() -> None:
    """A load-balanced context-parallel rank holds queries at two runs of positions (zig-zag chunks): its causal
    triangle, window and padding are the rows of the whole sequence's masks at those positions."""
    from blockir.diagnostics import UNKNOWN_SPAN
    from blockir.lower.layers.masks import MaskBuilder
    keep = torch.tensor([[1] * 8, [0, 0] + [1] * 6])
    whole = MaskBuilder("attn", UNKNOWN_SPAN, (2, 1, 8, 8))
    whole.window(3, torch.device("cpu"))
    whole.attention_mask(keep, "attention_mask")
    positions = torch.tensor([2, 3, 4, 5])  # rank 1 of 2 over 4 chunks of 2: chunks 1 and 2
    part = MaskBuilder("attn", UNKNOWN_SPAN, (2, 1, 4, 8), positions)
    part.window(3, torch.device("cpu"))
    part.attention_mask(keep, "attention_mask")
    full, _ = whole.build(True, torch.float32, torch.device("cpu"))
    rows, _ = part.build(True, torch.float32, torch.device("cpu"))
    assert torch.equal(rows, full.expand(2, 1, 8, 8)[:, :, positions])
    assert rows[0, 0, 0].tolist() == [True, True, True, False, False, False, False, False]
