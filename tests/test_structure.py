"""One residual-structure analysis: dot, telemetry, the classifier and the verifiers agree on the stream."""
from __future__ import annotations

import re

import torch

import blockir
from blockir.analyses.classify import classify
from blockir.analyses.sizes import Sizes
from blockir.lifecycle.telemetry import QUANTILES, telemetry
from blockir.reports.dot import block_to_dot

HEAD = """dim B: batch
dim S: seq
dim T: seq
dim D: model = 16
dim F: hidden = 32
"""


def _spine_nodes(dot: str) -> list[str]:
    return re.findall(r'^  "([^"]+)" \[label=[^\n]*group=spine', dot, re.M)


def test_dot_draws_the_state_as_the_spine_even_when_memory_comes_first() -> None:
    program = blockir.parse(HEAD + """
block Dec(memory: [B, S, D], x: [B, T, D]) -> [B, T, D] {
  n1: layernorm(D)
  sa: self_attention(heads=2, causal=true)
  n2: layernorm(D)
  ca: cross_attention(heads=2)
  h = x + sa(n1(x))
  y = h + ca(n2(h), memory)
  return y
}
""", "dec.block")
    assert _spine_nodes(block_to_dot(program.block("Dec"))) == ["x", "h", "y"]


def _telemetry(source: str, name: str) -> tuple[list, dict[str, torch.Tensor]]:
    program = blockir.parse(HEAD + source, "t.block")
    module = blockir.compile(program, name, seed=0)
    _, values = blockir.trace(module, torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0)))
    return telemetry(program, program.block(name), values, Sizes.of(program)), values


def _rho(x: torch.Tensor, u: torch.Tensor) -> list[float]:
    x, u = x.double().reshape(-1, 16), u.double().reshape(-1, 16)
    rho = u.norm(dim=-1) / (x.norm(dim=-1) + 1e-12)
    return torch.quantile(rho, torch.tensor(QUANTILES, dtype=torch.float64)).tolist()


def test_telemetry_finds_the_state_whatever_the_operand_order() -> None:
    sites, values = _telemetry("""
block A(x: [B, S, D]) -> [B, S, D] {
  ln: layernorm(D)
  attn: self_attention(heads=2)
  a = attn(ln(x))
  h = a + x
  return h
}
""", "A")
    (site,) = sites
    assert site.site == "h"
    assert list(site.rho) == _rho(values["x"], values["a"])  # x is the state, though it is the right operand


def test_a_parallel_update_is_one_site_whose_update_sums_the_branches() -> None:
    sites, values = _telemetry("""
block P(x: [B, S, D]) -> [B, S, D] {
  ln: layernorm(D)
  attn: self_attention(heads=2)
  mlp: mlp(F)
  n = ln(x)
  a = attn(n)
  m = mlp(n)
  y = x + a + m
  return y
}
""", "P")
    (site,) = sites
    assert site.site == "y"
    assert site.rho == tuple(_rho(values["x"], values["a"].double() + values["m"].double()))


PARALLEL = HEAD + """
block P(x: [B, S, D]) -> [B, S, D] {
  ln: layernorm(D)
  attn: self_attention(heads=2)
  mlp: mlp(F)
  n = ln(x)
  y = x + UPDATE
  return y
}
"""


def test_a_dropout_over_a_summed_parallel_update_keeps_both_branches() -> None:
    plain = blockir.parse(PARALLEL.replace("UPDATE", "mlp(n) + attn(n)"), "p.block")
    dropped = blockir.parse(PARALLEL.replace("UPDATE", "dropout(mlp(n) + attn(n), p=0.0)")
                            .replace("  ln: ", "  const parallel_residual = 1\n  ln: "), "p.block")
    a, b = classify(plain, plain.block("P")), classify(dropped, dropped.block("P"))
    assert a.topology == b.topology == "parallel_shared_norm"
    assert a.branch_order == b.branch_order == ("mlp", "causal_self_attention")
    assert blockir.verify(dropped) == []
