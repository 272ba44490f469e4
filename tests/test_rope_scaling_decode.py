"""Dynamic and LongRoPE scaling while decoding past the original context: ``blockir.from_pretrained`` and
HF's model, given the same calls, agree on every cached step, on greedy generation with left padding, and on
the dynamic scheme's return to its original base once a call is short again."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import blockir  # noqa: E402

COMMON = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, initializer_range=0.2)  # weights large enough that rotation shows
# both extend a context of 8 positions; the tests decode to 15
CONFIGS = {
    "llama-dynamic": dict(COMMON, model_type="llama", max_position_embeddings=8,
                          rope_parameters=dict(rope_type="dynamic", factor=4.0, rope_theta=10000.0)),
    "phi3-longrope": dict(COMMON, model_type="phi3", max_position_embeddings=32, original_max_position_embeddings=8,
                          pad_token_id=0, rope_parameters=dict(rope_type="longrope", short_factor=[1.0, 1.1, 1.3, 2.0],
                                                               long_factor=[1.2, 2.5, 6.0, 20.0], rope_theta=10000.0)),
}
PROMPT = torch.tensor([[5, 17, 42, 8, 61], [9, 9, 23, 70, 11]])


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    torch.manual_seed(0)
    real = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**CONFIGS[request.param]))
    folder: Path = tmp_path_factory.mktemp(request.param)
    real.eval().save_pretrained(folder)
    return real, blockir.from_pretrained(folder)


@torch.no_grad()
def test_cached_steps_past_the_original_context_equal_hf(pair) -> None:
    real, lm = pair
    hf_cache, cache = transformers.DynamicCache(), blockir.KVCache()
    tokens, ids, steps = PROMPT, PROMPT, []
    for _ in range(10):
        want = real(ids, cache=hf_cache, use_cache=True).logits
        got = lm(ids, past_key_values=cache, use_cache=True).logits
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
        ids = want[:, -1:].argmax(-1)
        tokens, steps = torch.cat([tokens, ids], dim=1), steps + [want[:, -1]]
    assert cache.get_seq_length() == 14
    # one pass over the same tokens: every position rotates by the frequencies of the whole length
    want, got = real(tokens[:, :-1]).logits, lm(tokens[:, :-1]).logits
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    # the cached keys kept the frequencies they were rotated with, so the last cached step is another result
    assert (want[:, -1] - steps[-1]).abs().max() > 1e-3
    # a short call again: the dynamic base returns to the original one, LongRoPE to its short factors
    short, got = real(tokens[:, :6]).logits, lm(tokens[:, :6]).logits
    assert torch.allclose(got, short, rtol=1e-5, atol=1e-5), (got - short).abs().max()
    assert (short - want[:, :6]).abs().max() > 1e-3  # the scaling acted on the long pass


@torch.no_grad()
def test_exact_mode_steps_bit_for_bit_past_the_original_context(pair, tmp_path: Path) -> None:
    real, _ = pair
    real.save_pretrained(tmp_path)
    exact = blockir.from_pretrained(tmp_path, exact=True)
    real.set_attn_implementation("eager")
    try:
        hf_cache, cache, ids = transformers.DynamicCache(), blockir.KVCache(), PROMPT
        for _ in range(8):
            want = real(ids, cache=hf_cache, use_cache=True).logits
            assert torch.equal(exact(ids, past_key_values=cache, use_cache=True).logits, want)
            ids = want[:, -1:].argmax(-1)
    finally:
        real.set_attn_implementation("sdpa")


def test_greedy_generation_with_left_padding_equals_hf(pair) -> None:
    real, lm = pair
    keep = torch.ones_like(PROMPT)
    keep[1, :2] = 0
    want = real.generate(PROMPT, attention_mask=keep, max_new_tokens=10, do_sample=False, pad_token_id=0,
                         eos_token_id=[])
    got = lm.generate(PROMPT, attention_mask=keep, max_new_tokens=10, pad_token_id=0, eos_token_id=[])
    assert torch.equal(got, want)
