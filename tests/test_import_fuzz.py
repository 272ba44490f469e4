"""Structured fuzzing of transformers configs: each family's tiny valid config with fields mutated (types, NaN and
infinities, signs, huge and fractional sizes, missing and extra fields, nested junk, RoPE dicts with unknown keys
or values). Every case ends in a file that checks clean or a located BlockError from the importer's range; never
another exception. ``BLOCKIR_FUZZ_CASES`` raises the number of cases (default 300)."""
from __future__ import annotations

import math
import os
import random
from typing import Any

import pytest

import blockir
from blockir.api import hf_block_text as block_text
from blockir.importers.hf.config import table
from blockir.importers.hf.schema import FAMILIES
from hf_configs import CONFIGS, MORE_CONFIGS
from test_import_fields import OTHER

BASES = {**CONFIGS, **{f"more-{k}": v for k, v in MORE_CONFIGS.items()}}
CASES = int(os.environ.get("BLOCKIR_FUZZ_CASES", "300"))
IMPORTER_CODES = {f"E08{n:02d}" for n in range(30)}  # E0814 (a written file failing its check) is a bug


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


JUNK: list[Any] = [None, True, False, 0, -1, 1, 3, 1.5, -0.5, 2 ** 40, 10 ** 9, math.nan, math.inf, -math.inf, 1e-300,
                   "4", "abc", "", [], {}, [1, 2], {"a": 1}, {"rope_type": "linear"}, _deep(40), _deep(5), 7.0,
                   ["sliding_attention"], ["full_attention", "bogus"], 0.999, 1.0, 1e308, 2 ** 31 - 1, 100_000, 5000,
                   [[["global"], 5000]], 17, 6]
ROPES: list[Any] = [
    {"rope_type": "linear", "factor": 2.0}, {"rope_type": "linear"}, {"rope_type": "linear", "factor": -1},
    {"rope_type": "linear", "factor": 2.0, "bogus": 1}, {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "longrope", "short_factor": [1.0]}, {"type": "linear", "factor": 4},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}, {"rope_type": "yarn"},
    {"rope_type": "yarn", "factor": 4.0, "beta_fast": math.nan, "original_max_position_embeddings": 16},
    {"rope_theta": 0}, {"rope_theta": -5.0}, {"rope_theta": math.inf}, {"rope_theta": "1e4"},
    {"partial_rotary_factor": 1.5}, {"partial_rotary_factor": 0.3}, {"partial_rotary_factor": 0.25},
    {"rope_type": 5}, {"rope_type": ["linear"]}, {"full_attention": {"rope_type": "default", "rope_theta": 1e4}},
    {"full_attention": 3}, [], "linear", None,
]


def _mutate(rng: random.Random, base: dict[str, Any]) -> dict[str, Any]:
    config = dict(base)
    fields = sorted(set(config) | set(table(FAMILIES[config["model_type"]])))
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        what = rng.random()
        field = rng.choice(fields)
        family = FAMILIES.get(config.get("model_type")) if isinstance(config.get("model_type"), str) else None
        kind = table(family).get(field, ("any",))[0].rstrip("?") if family else "any"
        if what < 0.2 and kind in OTHER and config.get(field) is not None:  # another valid value
            config[field] = OTHER[kind](config[field])
        elif what < 0.45:
            config[field] = rng.choice(JUNK)
        elif what < 0.6:
            config.pop(field, None)
        elif what < 0.75:
            config[rng.choice(("rope_parameters", "rope_scaling"))] = rng.choice(ROPES)
        elif what < 0.85 and isinstance(config.get(field), int) and not isinstance(config.get(field), bool):
            config[field] = config[field] * rng.choice((0, 2, 3)) + rng.choice((0, 1, -1))
        elif what < 0.92:
            config[rng.choice(("bogus_field", "n_embd", "hidden_size", "head_dim", "rotary_dim"))] = rng.choice(JUNK)
        else:
            config["architectures"] = rng.choice([[], ["Nope"], "LlamaModel", [5], None, ["X", "Y"]])
    return config


def _outcome(config: dict[str, Any]) -> str:
    """"ok" for a file that checks clean, else the codes of the located diagnostics; any other exception fails."""
    try:
        text = block_text(config)
    except blockir.BlockError as exc:
        for d in exc.diagnostics:
            assert d.code in IMPORTER_CODES and d.code != "E0814", (d.code, str(exc))
            assert d.span.filename.startswith("<hf config>: $"), str(exc)
            assert d.hint is None or d.hint
        return ",".join(sorted({d.code for d in exc.diagnostics}))
    found = [d for d in blockir.verify(blockir.parse(text, "imported.block")) if d.is_error]
    assert not found, found
    return "ok"


def test_every_base_config_imports_and_checks_clean() -> None:
    assert {_outcome(dict(c)) for c in BASES.values()} == {"ok"}


def test_mutated_configs_end_in_a_clean_file_or_a_located_error() -> None:
    rng = random.Random(20)
    names = sorted(BASES)
    outcomes: dict[str, int] = {}
    for case in range(CASES):
        config = _mutate(rng, BASES[names[case % len(names)]])
        try:
            outcome = _outcome(config)
        except Exception as exc:  # the case is part of the failure message
            raise AssertionError(f"case {case}: {config!r:.2000}") from exc
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # the mutations reach both ends and the schema's codes (a fuzz that only ever fails early tests nothing)
    assert outcomes.get("ok", 0) > CASES // 10
    seen = {code for o in outcomes for code in o.split(",")}
    assert {"E0807", "E0808", "E0810"} <= seen, outcomes


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_family_has_a_fuzzed_base(model_type: str) -> None:
    assert any(c["model_type"] == model_type for c in BASES.values())
