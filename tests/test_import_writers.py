"""The writer registry: every family the importer reads has a writer and a norm entry, and every norm a written
file declares is written from that entry."""
from __future__ import annotations

import re

import pytest

from blockir.importers.hf.config import read_fields
from blockir.importers.hf.entry import import_text
from blockir.importers.hf.schema import FAMILIES
from blockir.importers.hf.text import Config, Norm
from blockir.importers.hf.writer import NORMS, WRITERS, register
from hf_configs import CONFIGS, MORE_CONFIGS

NORM_DECL = re.compile(r"^  [\w.]+: ((?:layernorm|rmsnorm)\(.*\))$", re.M)


def test_every_family_has_one_writer_and_one_norm_entry() -> None:
    assert sorted(WRITERS) == sorted(NORMS) == sorted(FAMILIES)
    with pytest.raises(ValueError, match="model type 'llama' has two writers"):
        register("llama", WRITERS["llama"], NORMS["llama"])


@pytest.mark.parametrize("name", sorted({**CONFIGS, **MORE_CONFIGS}))
def test_every_norm_a_file_declares_is_its_family_entry(name: str) -> None:
    config = {**CONFIGS, **MORE_CONFIGS}[name]
    model_type, values, _ = read_fields(config)
    c = Config(values, NORMS[model_type])
    declared = set(NORM_DECL.findall(import_text(config)))
    assert declared and declared <= {c.norm("D"), c.norm("E")}, (declared, c.norm())


def test_a_norm_entry_writes_eps_from_its_field_the_fixed_options_and_a_switched_off_affine() -> None:
    c = Config({"layer_norm_eps": 1e-12, "elementwise_affine": False}, Norm("layernorm", "layer_norm_eps"))
    assert c.norm() == "layernorm(D, eps=1e-12)"
    assert c.norm("E") == "layernorm(E, eps=1e-12)"
    spec = Norm("rmsnorm", 1e-5, ("offset=1", "cast=after_weight"), affine="elementwise_affine")
    assert Config(c.raw, spec).norm() == "rmsnorm(D, eps=1e-05, offset=1, cast=after_weight, affine=false)"
    assert Config({}, Norm("layernorm")).norm() == "layernorm(D)"
