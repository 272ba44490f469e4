"""Every field a family's HF code reads reaches the file: changed to another valid value, it changes the `.block`,
or the importer refuses it at that field, or it is listed here with the reason it cannot change the forward."""
from __future__ import annotations

from typing import Any, Callable

import pytest

import blockir
# the texts are compared as written, unchecked: the check of each written file (60 ms) is the fuzz test's part
from blockir.importers.hf.entry import import_text as block_text
from blockir.importers.hf.config import read_fields
from blockir.importers.hf.schema import FAMILIES
from blockir.importers.hf.versions import transformers_at_least
from hf_configs import CONFIGS, MORE_CONFIGS

BASES: dict[str, dict[str, Any]] = {}
for _config in (*CONFIGS.values(), *MORE_CONFIGS.values()):
    BASES.setdefault(_config["model_type"], _config)  # the first, plainest config of each type
# another valid value of a field of each kind
OTHER: dict[str, Callable[[Any], Any]] = {
    "size": lambda v: 2 * v if v else 32, "heads": lambda v: 1 if v != 1 else 2, "layers": lambda v: 3 if v != 3 else 2,
    "window": lambda v: 3 if v != 3 else 4, "eps": lambda v: 1e-3 if v != 1e-3 else 1e-4,
    "positive": lambda v: 2.5 if v != 2.5 else 3.5, "real": lambda v: 0.5 if v != 0.5 else 0.25,
    "prob": lambda v: 0.25 if v != 0.25 else 0.0, "fraction": lambda v: 0.5 if v != 0.5 else 0.25,
    "bool": lambda v: not v, "act": lambda v: "relu" if v != "relu" else "gelu", "token": lambda v: 1 if v != 1 else 2,
}
ROPE = {t for t, f in FAMILIES.items() if "rope_parameters" in f.fields} | {"gptj", "codegen"}
ENCODERS = {"bert", "camembert", "distilbert", "electra", "roberta", "xlm-roberta"}
# fields that cannot change the forward of the tested config, with the reason and the families it holds for
NO_EFFECT: dict[str, tuple[str, set[str]]] = {
    "max_position_embeddings": ("RoPE positions are computed, not looked up: the context length bounds nothing",
                                ROPE - {"gptj", "codegen"}),
    "n_positions": ("GPT-J-style rotary positions are computed, not looked up", {"gptj", "codegen"}),
    "use_cache": ("read only by the exact mode (kv_cache=true), not by the default SDPA path", set(FAMILIES)),
    "max_window_layers": ("without use_sliding_window no layer slides", {"qwen2", "qwen3", "qwen2_moe"}),
    "sliding_window": ("kept only with use_sliding_window, which the tested config leaves off",
                       {"qwen2", "qwen3", "smollm3", "qwen3_moe"}),
    "use_sliding_window": ("the tested config has no sliding_window to switch on", {"qwen2", "qwen3", "smollm3"}),
    "no_rope_layer_interval": ("the tested config's two layers keep RoPE at intervals 4 and 8 alike "
                               "(test_rope_fields_reach_the_file changes it where it acts)", {"smollm3"}),
    "tie_word_embeddings": ("the base model of an encoder has no head to tie", ENCODERS),
    "attention_dropout": ("before transformers 5.25 Falcon's rotary attention applies no dropout to the attention "
                          "weights", set() if transformers_at_least(5, 25) else {"falcon"}),
    "original_max_position_embeddings": ("read only by longrope scaling, which the tested config does not use "
                                         "(test_rope_fields_reach_the_file changes it where it acts)", {"phi3"}),
    "num_kv_heads": ("read only with new_decoder_architecture or without multi_query", {"falcon"}),
    "num_ln_in_parallel_attn": ("read only with new_decoder_architecture", {"falcon"}),
    "rope_theta": ("the tested config's rope_parameters hold their own base, which wins", {"olmo3", "cwm"}),
    "partial_rotary_factor": ("the class's rotary embedding turns every channel whatever the factor says "
                              "(test_a_rotary_embedding_that_turns_every_channel_ignores_partial_rotary_factor)",
                              {"arcee", "cohere", "cohere2", "falcon", "gemma", "gemma2", "granite", "granitemoe",
                               "helium", "llama", "ministral", "mistral", "mixtral", "olmo", "olmo2", "olmoe", "qwen2",
                               "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss", "smollm3", "starcoder2"}),
}


def _cases() -> list[tuple[str, str]]:
    return [(t, name) for t in sorted(FAMILIES) for name, spec in FAMILIES[t].fields.items()
            if len(spec) == 2 or spec[2] in ("row", "rope") or spec[2].startswith("=")
            if spec[0].rstrip("?") in OTHER]


@pytest.mark.parametrize("model_type, name", _cases(), ids=[f"{t}.{n}" for t, n in _cases()])
def test_a_changed_field_changes_the_file_or_is_refused_there(model_type: str, name: str) -> None:
    base = BASES[model_type]
    _, values, _ = read_fields(dict(base))
    current = values.get(name, base.get(name, FAMILIES[model_type].fields[name][1]))
    kind = FAMILIES[model_type].fields[name][0].rstrip("?")
    changed = dict(base, **{name: OTHER[kind](current)})
    try:
        text = block_text(changed)
    except blockir.BlockError as exc:
        assert {d.code for d in exc.diagnostics} <= {"E0800", "E0809"}, str(exc)
        assert any(d.span.filename.endswith(f"$.{name}") for d in exc.diagnostics) or \
            {d.code for d in exc.diagnostics} == {"E0809"}, str(exc)
        return
    reason, families = NO_EFFECT.get(name, ("", set()))
    assert (text == block_text(dict(base))) == (model_type in families), (name, reason)


# the fields of the scaled and per-layer RoPE configs, changed where they act
ROPE_FIELDS = [
    ("llama-dynamic", "max_position_embeddings", 16, "rope_original_max=16"),
    ("llama-dynamic", "rope_parameters", dict(rope_type="dynamic", factor=3.0), "rope_factor=3"),
    ("phi3-longrope", "original_max_position_embeddings", 16, "rope_original_max=16"),
    ("phi3-longrope", "max_position_embeddings", 128, "rope_factor=32"),
    ("phi3-longrope", "rope_parameters", dict(CONFIGS["phi3-longrope"]["rope_parameters"], attention_factor=1.5),
     "rope_attention_factor=1.5"),
    ("phi3-longrope", "rope_parameters", dict(CONFIGS["phi3-longrope"]["rope_parameters"],
                                              short_factor=[1, 2, 3, 4]), "rope_short_factor=[1, 2, 3, 4]"),
    ("phi3-longrope", "rope_parameters", dict(CONFIGS["phi3-longrope"]["rope_parameters"],
                                              long_factor=[5, 6, 7, 8.5]), "rope_long_factor=[5, 6, 7, 8.5]"),
    ("smollm3-nope", "no_rope_layer_interval", 2, "rotary_dim=16 * (((layer + 1) % 2 + 1) // 2)"),
    ("smollm3-nope", "no_rope_layers", [1, 1, 1, 0], "rotary_dim=16 * (((layer + 1) % 4 + 3) // 4)"),
    ("smollm3-nope", "use_sliding_window", False, None),
]


@pytest.mark.parametrize("config, name, value, written", ROPE_FIELDS,
                         ids=[f"{c}.{n}={v}" for c, n, v, _ in ROPE_FIELDS])
def test_rope_fields_reach_the_file(config: str, name: str, value: Any, written: str | None) -> None:
    base = block_text(CONFIGS[config])
    text = block_text(dict(CONFIGS[config], **{name: value}))
    assert text != base
    if written is not None:
        assert written in text and written not in base
    else:
        assert "window=" in base and "window=" not in text
