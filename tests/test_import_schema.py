"""The importer's field tables against the installed transformers: every config class's fields and defaults,
and every field its family's modeling code reads, so the tables cannot drift from what HF reads."""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from blockir.importers.hf.config import ROPE_LEGACY, read_fields  # noqa: E402
from blockir.importers.hf.family import COMMON, IGNORED, UNWRITTEN  # noqa: E402
from blockir.importers.hf.schema import FAMILIES, KIND_NAMES  # noqa: E402

BASE = transformers.PretrainedConfig
LEGACY = {*ROPE_LEGACY, "rope_scaling", "rope_local_base_freq"}  # folded into rope_parameters by the class


def _config_class(model_type: str) -> type:
    cls = CONFIG_MAPPING[model_type]
    assert cls.__name__ == FAMILIES[model_type].config
    return cls


def _modeling_reads(model_type: str) -> set[str]:
    """``config.NAME`` and ``getattr(config, "NAME"`` in the family's modeling file (the file of the causal-LM class
    HF builds where the family has none of its own, as InternLM3's config builds LLaMA), less the config's methods."""
    source = Path(sys.modules[_config_class(model_type).__module__].__file__.replace("configuration_", "modeling_"))
    if not source.exists():
        built = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
        source = Path(sys.modules[built.__module__].__file__)
    text = source.read_text()
    names = set(re.findall(r"\bconfig\.([A-Za-z_]\w*)", text)) | \
        set(re.findall(r"getattr\(\s*(?:self\.)?config\s*,\s*[\"'](\w+)", text))
    return {n for n in names if not callable(getattr(BASE, n, None)) and not isinstance(getattr(BASE, n, None), property)}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_defaults_equal_the_config_class(model_type: str) -> None:
    cls = _config_class(model_type)
    real = cls()
    _, values, _ = read_fields({"model_type": model_type})
    own = {f.name for f in dataclasses.fields(cls)} - {f.name for f in dataclasses.fields(BASE)}
    assert own <= set(FAMILIES[model_type].fields), sorted(own - set(FAMILIES[model_type].fields))
    for name in sorted(own - LEGACY):
        assert values[name] == getattr(real, name), name
    if "rope_parameters" in own:
        assert values["rope_parameters"] == real.rope_parameters
    assert FAMILIES[model_type].aliases == dict(getattr(cls, "attribute_map", {}))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_the_table_lists_every_field_the_modeling_code_reads(model_type: str) -> None:
    family = FAMILIES[model_type]
    known = set(family.fields) | set(family.aliases) | set(COMMON)
    assert _modeling_reads(model_type) <= known, sorted(_modeling_reads(model_type) - known)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_note_and_kind_is_one_the_schema_knows(model_type: str) -> None:
    fields = {**COMMON, **FAMILIES[model_type].fields}
    for name, (kind, _default, *note) in fields.items():
        assert kind.rstrip("?") in KIND_NAMES, (name, kind)
        assert not note or note[0] in IGNORED or note[0] in ("rope", "row") or note[0].startswith("="), (name, note)


def test_a_derived_default_follows_the_given_fields() -> None:
    """The config class derives head_dim, key/value heads and layer types from the fields given."""
    _, values, _ = read_fields({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
                                "num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": 5,
                                "max_window_layers": 1, "num_key_value_heads": None})
    real = transformers.Qwen2Config(hidden_size=64, num_attention_heads=4, num_hidden_layers=3,
                                    use_sliding_window=True, sliding_window=5, max_window_layers=1,
                                    num_key_value_heads=None)
    assert (values["head_dim"], values["num_key_value_heads"], values["layer_types"]) == \
        (16, 4, ["full_attention", "sliding_attention", "sliding_attention"]) == \
        (real.hidden_size // real.num_attention_heads, real.num_key_value_heads, real.layer_types)
    _, values, _ = read_fields({"model_type": "gpt_neox", "num_key_value_heads": 3, "rotary_pct": 0.5,
                                "rotary_emb_base": 500.0})
    assert "num_key_value_heads" not in values  # GPT-NeoX's code never reads it
    assert values["rope_parameters"] == transformers.GPTNeoXConfig(rotary_pct=0.5, rotary_emb_base=500.0).rope_parameters


def test_each_refused_model_type_is_one_transformers_has_and_no_table_writes() -> None:
    assert set(UNWRITTEN) <= set(CONFIG_MAPPING), sorted(set(UNWRITTEN) - set(CONFIG_MAPPING))
    assert not set(UNWRITTEN) & set(FAMILIES)
