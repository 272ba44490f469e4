"""`architectures` decides the class written: the base model (keys without the prefix, the last hidden state) loads
the real HF base model's state dict strictly and equals its output; an unknown class is a located error."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import blockir  # noqa: E402
from blockir.api import hf_block_text as block_text  # noqa: E402
from blockir.importers.hf.family import BASES  # noqa: E402
from hf_configs import CONFIGS, MORE_CONFIGS  # noqa: E402

ALL = {**CONFIGS, **MORE_CONFIGS}
FAMILIES = ["llama", "gpt2", "gpt_neox", "opt", "falcon", "gemma2", "gpt_neo"]
EAGER_ONLY = {"gemma2", "bloom", "gpt_neo"}


@pytest.mark.parametrize("name", FAMILIES)
def test_the_base_model_loads_strictly_and_equals_hf(name: str) -> None:
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**ALL[name])
    cfg._attn_implementation = "eager" if name in EAGER_ONLY else "sdpa"
    real = transformers.AutoModel.from_config(cfg).eval()
    base = BASES[ALL[name]["model_type"]][0]
    assert type(real).__name__ == base
    program = blockir.parse(block_text(dict(ALL[name], architectures=[base])), f"<{name}>")
    ours = blockir.compile(program, base, seed=0).eval()
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in real.state_dict().items()}
    ours.load_state_dict(real.state_dict(), strict=True)
    ids = torch.randint(2, 97, (2, 7), generator=torch.Generator().manual_seed(1))
    keep = torch.ones(2, 7, dtype=torch.long)
    keep[1, -2:] = 0
    with torch.no_grad():
        want = real(input_ids=ids, attention_mask=keep).last_hidden_state
        got = ours(ids, attention_mask=keep)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()


def test_the_causal_lm_named_is_the_class_written_by_default() -> None:
    assert block_text(dict(CONFIGS["llama"], architectures=["LlamaForCausalLM"])) == block_text(CONFIGS["llama"])


@pytest.mark.parametrize("name, architecture, supported", [
    ("llama", "LlamaForSequenceClassification", "LlamaForCausalLM, LlamaModel"),
    ("bert", "BertForSequenceClassification", "BertModel, BertForMaskedLM"),
])
def test_an_architecture_not_written_is_refused_with_the_supported_ones(name: str, architecture: str,
                                                                        supported: str) -> None:
    with pytest.raises(blockir.BlockError) as info:
        block_text(dict(ALL[name], architectures=[architecture]), source="config.json")
    (d,) = info.value.diagnostics
    assert (d.code, str(d.span), d.hint) == ("E0812", "config.json: $.architectures[0]", f"supported: {supported}")
