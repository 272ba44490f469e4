"""``blockir.from_pretrained`` on folders ``save_pretrained`` wrote, one tiny random model per causal family.

Each family's model loads strictly; its logits equal HF's (unpadded, left- and right-padded), and
bit for bit in exact mode against HF's eager attention, through the KV cache too; greedy ``generate``
equals HF's token for token; logits computed one position at a time through the cache equal a full
recompute.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import blockir  # noqa: E402
from hf_families import EAGER_ONLY, FAMILIES, SHARDED  # noqa: E402

NEW = 4


def _ids() -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 97, (2, 6), generator=gen)
    left = torch.ones(2, 6, dtype=torch.long)
    left[1, :2] = 0
    return ids, left


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Any, Path, Any]]:
    """The HF model of a family, the folder it was saved to and blockir's model of it, built once per module."""
    built: dict[str, tuple[Any, Path, Any]] = {}

    def get(family: str) -> tuple[Any, Path, Any]:
        if family not in built:
            torch.manual_seed(0)
            cfg = transformers.AutoConfig.for_model(**FAMILIES[family])
            cfg._attn_implementation = "eager" if family in EAGER_ONLY else "sdpa"
            real = transformers.AutoModelForCausalLM.from_config(cfg).eval()
            folder = tmp_path_factory.mktemp(family)
            real.save_pretrained(folder, max_shard_size="20KB" if family in SHARDED else "5GB")
            built[family] = real, folder, blockir.from_pretrained(folder)
        return built[family]
    return get


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_equal_hf_with_and_without_padding(family: str, pair) -> None:
    real, _, lm = pair(family)
    assert set(lm.state_dict()) == set(real.state_dict())
    ids, left = _ids()
    right = left.flip(-1)
    with torch.no_grad():
        for keep in (None, left, right):
            want = real(input_ids=ids, attention_mask=keep).logits
            got = lm(ids, attention_mask=keep).logits
            kept = torch.ones_like(ids, dtype=torch.bool) if keep is None else keep.bool()
            assert torch.allclose(got[kept], want[kept], rtol=1e-5, atol=1e-5), (got - want)[kept].abs().max()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_generate_equals_hf_token_for_token(family: str, pair) -> None:
    """One HF call covers both cases: row 0 of the batch is unpadded, row 1 left-padded."""
    real, _, lm = pair(family)
    ids, left = _ids()
    want = real.generate(ids, attention_mask=left, max_new_tokens=NEW, do_sample=False)
    got = lm.generate(ids, max_new_tokens=NEW, attention_mask=left)
    assert got.dtype == torch.long and torch.equal(got, want), (got, want)
    alone = lm.generate(ids[:1], max_new_tokens=NEW)  # no mask at all: the causal kernels' own path
    assert torch.equal(alone, want[:1, :alone.shape[1]])  # alone, it may stop earlier than the batch


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_incremental_logits_equal_a_full_recompute(family: str, pair) -> None:
    lm = pair(family)[2]
    ids, left = _ids()
    text = lm.generate(ids, max_new_tokens=NEW, eos_token_id=[])  # no early stop: every row runs NEW steps
    keep = torch.cat([left, torch.ones(2, NEW, dtype=torch.long)], dim=-1)
    positions = (keep.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = lm(text, attention_mask=keep, position_ids=positions).logits
        out = lm(text[:, :6], attention_mask=keep[:, :6], position_ids=positions[:, :6], use_cache=True)
        steps = [out.logits]
        for i in range(6, text.shape[1]):
            out = lm(text[:, i:i + 1], attention_mask=keep[:, :i + 1], position_ids=positions[:, i:i + 1],
                     past_key_values=out.past_key_values)
            steps.append(out.logits)
    step = torch.cat(steps, dim=1)
    kept = keep.bool()
    assert out.past_key_values.get_seq_length() == text.shape[1]
    assert (step - full)[kept].abs().max() <= 1e-5 * full[kept].abs().max()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_exact_mode_is_bit_exact_through_the_cache(family: str, pair) -> None:
    real, folder, _ = pair(family)
    real.set_attn_implementation("eager")
    if real.config._attn_implementation != "eager":  # a class that cannot switch (Falcon): load it eager
        real = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    try:
        lm = blockir.from_pretrained(folder, exact=True)
        ids, left = _ids()
        with torch.no_grad():
            want, got = real(input_ids=ids, attention_mask=left), lm(ids, attention_mask=left, use_cache=True)
            assert torch.equal(got.logits[left.bool()], want.logits[left.bool()])
            hf, ours = real(input_ids=ids, use_cache=True), lm(ids, use_cache=True)
            nxt = hf.logits[:, -1].argmax(-1, keepdim=True)
            assert torch.equal(lm(nxt, past_key_values=ours.past_key_values).logits,
                               real(input_ids=nxt, cache=hf.cache).logits)
    finally:
        real.set_attn_implementation("eager" if family in EAGER_ONLY else "sdpa")
