"""A residual that continues from a normalized value, stated with ``const residual_from_norm = 1``."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import blockir
from blockir.analyses.classify import classify
from blockir.analyses.manifest import program_manifest
from oracle import assert_matches_reference

HEADER = """
dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16
"""
D = 8
BODY = """
block T(x: [B, S, D]) -> [B, S, D] {
  const residual_from_norm = 1
  ln_1: layernorm(D, accum=f64)
  ff_1: linear(D, D)
  ln_2: rmsnorm(D, accum=f64)
  up: linear(D, F)
  down: linear(F, D)
  h = x + ff_1(ln_1(x))
  n = ln_2(h)
  y = n + down(gelu(up(n)))
  return y
}"""


def _ref(x: Tensor, p: dict[str, Tensor]) -> Tensor:
    n1 = F.layer_norm(x, (D,), p["ln_1.weight"], p["ln_1.bias"], 1e-5)
    h = x + F.linear(n1, p["ff_1.weight"], p["ff_1.bias"])
    n = p["ln_2.weight"] * h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6)
    return n + F.linear(F.gelu(F.linear(n, p["up.weight"], p["up.bias"])), p["down.weight"], p["down.bias"])


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_stated_residual_from_norm_compiles_to_its_equation(backend: str) -> None:
    m = blockir.compile(blockir.parse(HEADER + BODY), "T", seed=0, backend=backend, dtype=torch.float64)
    assert_matches_reference(m, _ref, (2, 3, D))


def test_stated_residual_from_norm_checks_clean_and_is_reported() -> None:
    program = blockir.parse(HEADER + BODY)
    assert [d for d in blockir.verify(program) if d.is_error or d.severity == "warning"] == []
    assert classify(program, program.block("T")).topology == "residual_from_norm"
    manifest = program_manifest(program)["blocks"]["T"]
    assert manifest["residual"]["from_norm"] == [None, "ln_2"]
    assert manifest["stated"] == {"residual_from_norm": 1}


def test_unstated_residual_from_norm_stays_an_error() -> None:
    program = blockir.parse(HEADER + BODY.replace("  const residual_from_norm = 1\n", ""))
    assert [d.code for d in blockir.verify(program) if d.is_error] == ["E0412"]
    program = blockir.parse(HEADER + BODY.replace("residual_from_norm = 1", "residual_from_norm = 0"))
    assert [d.code for d in blockir.verify(program) if d.is_error] == ["E0412"]


def test_stated_residual_from_norm_that_is_not_one_is_reported() -> None:
    body = BODY.replace("  n = ln_2(h)\n  y = n + down(gelu(up(n)))", "  y = h + down(gelu(up(ln_2(h))))")
    diags = [d for d in blockir.verify(blockir.parse(HEADER + body)) if d.is_error]
    assert [(d.code, d.message, d.span.line) for d in diags] == [
        ("E0407", "'T' states residual_from_norm = 1 (an update continues the stream from a normalized value), "
                  "but this update continues from an un-normalized state, as every update of the block does", 14)]
