"""``CausalLM.generate``: sampling as HF samples, end-of-sequence and padding as HF pads, a real cache."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import blockir  # noqa: E402
from hf_families import FAMILIES  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    torch.manual_seed(0)
    real = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**FAMILIES["llama"]))
    folder: Path = tmp_path_factory.mktemp("llama")
    real.eval().save_pretrained(folder)
    return real, blockir.from_pretrained(folder)


IDS = torch.tensor([[5, 17, 42, 8, 61], [9, 9, 23, 70, 11]])


@pytest.mark.parametrize("options", [dict(), dict(temperature=0.7), dict(top_k=5), dict(top_p=0.8),
                                     dict(temperature=1.3, top_k=20, top_p=0.9)])
def test_sampling_draws_what_hf_draws_from_the_same_seed(options: dict, pair) -> None:
    real, lm = pair
    torch.manual_seed(7)
    want = real.generate(IDS, max_new_tokens=6, do_sample=True, top_k=options.get("top_k", 0),
                         **{k: v for k, v in options.items() if k != "top_k"})
    torch.manual_seed(7)
    got = lm.generate(IDS, max_new_tokens=6, do_sample=True, **options)
    assert torch.equal(got, want)


def test_a_generator_makes_sampling_reproducible(pair) -> None:
    lm = pair[1]
    draws = [lm.generate(IDS, max_new_tokens=6, do_sample=True, generator=torch.Generator().manual_seed(3))
             for _ in range(2)]
    assert torch.equal(*draws)
    other = lm.generate(IDS, max_new_tokens=6, do_sample=True, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(draws[0], other)


def test_finished_sequences_are_padded_and_decoding_stops_as_in_hf(pair) -> None:
    real, lm = pair
    free = lm.generate(IDS, max_new_tokens=6, eos_token_id=[])
    eos = int(free[0, IDS.shape[1] + 1])  # the first row ends at its second new token
    want = real.generate(IDS, max_new_tokens=6, do_sample=False, eos_token_id=eos, pad_token_id=0)
    got = lm.generate(IDS, max_new_tokens=6, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(got, want)
    assert got[0, IDS.shape[1] + 1] == eos and (got[0, IDS.shape[1] + 2:] == 0).all()
    both = lm.generate(IDS, max_new_tokens=6, eos_token_id=[eos, int(free[1, IDS.shape[1]])])
    assert both.shape[1] <= IDS.shape[1] + 2  # every row finished: no further step


def test_each_position_is_embedded_once(pair) -> None:
    lm = pair[1]
    seen: list[int] = []
    hook = lm.get_submodule("model.embed_tokens").register_forward_hook(lambda m, args, out: seen.append(args[0].numel()))
    try:
        out = lm.generate(IDS, max_new_tokens=5, eos_token_id=[])
    finally:
        hook.remove()
    assert out.shape == (2, IDS.shape[1] + 5)
    assert seen == [IDS.numel()] + [2] * 4  # the prompt once, then one new token per row and step


@pytest.mark.parametrize("options, message", [
    (dict(max_new_tokens=-1), "max_new_tokens must be a non-negative int, got -1"),
    (dict(temperature=0.0), "temperature must be a positive number, got 0.0"),
    (dict(top_p=1.5), "top_p must be a number in [0, 1], got 1.5"),
    (dict(top_k=-2), "top_k must be a non-negative int (0: no cut), got -2"),
    (dict(eos_token_id="x"), "eos_token_id must be a token id (a non-negative int) or a list of them, got 'x'"),
    (dict(generator=3), "generator must be a torch.Generator, got int"),
    (dict(attention_mask=torch.ones(2, 3)), "attention_mask must be [batch, seq] = [2, 5], got [2, 3]"),
])
def test_bad_arguments_are_located(options: dict, message: str, pair) -> None:
    with pytest.raises(blockir.BlockError) as info:
        pair[1].generate(IDS, **options)
    (d,) = info.value.diagnostics
    argument = next(iter(options))
    assert (d.code, str(d.span), d.message) == ("E0839", f"blockir.CausalLM.generate({argument}=…)", message)
