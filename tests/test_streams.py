"""Multi-result blocks: stacks thread every carried stream layer to layer, next to the hidden state.

Hyper-connections (Zhu et al., "Hyper-Connections", arXiv:2409.19606), expansion rate 2, in the
static form: the branch reads a learned mix of the two residual streams, and each stream takes
its own learned share of the branch output,
    u = a1 * h1 + a2 * h2,    o = f(norm(u)),    h1' = h1 + b1 * o,    h2' = h2 + b2 * o.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import blockir
from blockir.analyses.keys import param_keys
from blockir.analyses.liveness import plan
from blockir.diagnostics import BlockError
from blockir.ir.printer import format_program

HYPER = """dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16

block HyperLayer(h1: [B, S, D], h2: [B, S, D], bias: [B, S, D]) -> ([B, S, D], [B, S, D]) {
  a1: scalar(init=0.5)
  a2: scalar(init=0.5)
  b1: scalar(init=1.0)
  b2: scalar(init=1.0)
  n: rmsnorm(D)
  f: mlp(F)
  u = a1 * h1 + a2 * h2
  o = f(n(u + bias))
  y1 = h1 + b1 * o
  y2 = h2 + b2 * o
  return y1, y2
}

model HyperModel(x: [B, S, D], bias: [B, S, D]) -> [B, S, D] {
  layers: HyperLayer * 3
  norm: rmsnorm(D)
  y1, y2 = layers(x, x, bias)
  return norm(y1 + y2)
}
"""


def test_hyper_connections_round_trip_and_verify_clean() -> None:
    program = blockir.parse(HYPER, "hyper.block")
    assert [d for d in blockir.verify(program) if d.is_error] == []
    text = format_program(program)
    assert "block HyperLayer(h1: [B, S, D], h2: [B, S, D], bias: [B, S, D]) -> ([B, S, D], [B, S, D]) {" in text
    assert "  y1, y2 = layers(x, x, bias)                     # [B, S, D], [B, S, D]" in text
    assert "  return y1, y2" in text
    assert blockir.parse(text, "printed.block") == program


def test_stack_threads_both_streams_and_broadcasts_the_rest_float64() -> None:
    m = blockir.compile(blockir.parse(HYPER), "HyperModel", dtype=torch.float64, seed=0)
    torch.manual_seed(0)
    for name, p in m.named_parameters():  # move the scalars off their inits so each one matters
        if name.split(".")[-1] in ("a1", "a2", "b1", "b2"):
            p.data.uniform_(0.2, 1.5)
    x, bias = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    h1, h2 = x, x
    for layer in m.layers:
        u = layer.a1 * h1 + layer.a2 * h2
        o = layer.f(layer.n(u + bias))
        h1, h2 = h1 + layer.b1 * o, h2 + layer.b2 * o
    torch.testing.assert_close(m(x, bias), m.norm(h1 + h2), rtol=1e-12, atol=1e-12)
    _, values = blockir.trace(m, x, bias)
    torch.testing.assert_close(values["layers.2.y2"], h2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(values["y1"], h1, rtol=1e-12, atol=1e-12)


def test_keys_and_liveness_see_every_layer_and_stream_of_a_multi_result_stack() -> None:
    program = blockir.parse(HYPER)
    keys = list(param_keys(program, "HyperModel").shapes)
    assert [k for k in keys if k.startswith("layers.2.")] == [
        "layers.2.a1", "layers.2.a2", "layers.2.b1", "layers.2.b2", "layers.2.n.weight", "layers.2.f.fc1.weight",
        "layers.2.f.fc1.bias", "layers.2.f.fc2.weight", "layers.2.f.fc2.bias"]
    p = plan(program.block("HyperLayer"), "infer")
    assert (p.decision("y1").target, p.decision("y2").target) == ("h1", "h2")


@pytest.mark.parametrize(("body", "message", "where"), [
    ("  y = layers(x, x, bias)\n  return norm(y)", "'layers' returns 2 values, bound to 1 name", (23, 7)),
    ("  y1, y2, y3 = layers(x, x, bias)\n  return norm(y1)", "'layers' returns 2 values, bound to 3 names", (23, 16)),
    ("  y1, y2 = norm(x)\n  return y1", "'norm' returns one value, bound to 2 names", (23, 12)),
])
def test_results_bound_to_the_wrong_number_of_names_are_located(body: str, message: str,
                                                               where: tuple[int, int]) -> None:
    text = HYPER.replace("  y1, y2 = layers(x, x, bias)\n  return norm(y1 + y2)", body)
    with pytest.raises(BlockError) as info:
        blockir.parse(text, "hyper.block")
    d = info.value.diagnostics[0]
    assert (d.code, d.message, d.span.line, d.span.column) == ("E0421", message, *where)


VALUE = """dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16

block Layer(x: [B, S, D], v1: [B, S, D]) -> ([B, S, D], [B, S, D]) {
  n: rmsnorm(D)
  f: mlp(F)
  lam: scalar(init=0.5)
  h = x + f(n(x) + lam * v1)
  return h, v1
}

model ValueModel(x: [B, S, D]) -> [B, S, D] {
  value: linear(D, D)
  layers: Layer * 3
  norm: rmsnorm(D)
  y, v_last = layers(x, value(x))
  return norm(y)
}
"""


def test_a_first_layer_value_passes_down_the_stack_unchanged_float64() -> None:
    """Value-residual style: the value made before the first layer reaches every layer as a carried stream."""
    program = blockir.parse(VALUE, "value.block")
    assert [d for d in blockir.verify(program) if d.is_error] == []
    m = blockir.compile(program, "ValueModel", dtype=torch.float64, seed=0)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    _, values = blockir.trace(m, x)
    v = m.value(x)
    for i in range(3):
        torch.testing.assert_close(values[f"layers.{i}.v1"], v, rtol=0, atol=0)
    h = x
    for layer in m.layers:
        h = h + layer.f(layer.n(h) + layer.lam * v)
    torch.testing.assert_close(values["y"], h, rtol=1e-12, atol=1e-12)


CARRIED_JOIN = """dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 32

block Layer(x: [B, S, D], v: [B, S, D]) -> ([B, S, D], [B, S, D]) {
  ln: rmsnorm(D)
  mlp: mlp(F)
  mix: scalar
  h = x + mlp(ln(x))
  y = h + JOIN
  return y, v
}
"""


@pytest.mark.parametrize("join, found", [
    ("v", [("E0426", 11, "the carried stream 'v' is added to the hidden state 'h' without a weight: carried beside "
                         "the hidden state, it joins it in every layer")]),
    ("dropout(v, p=0.1)", [("E0426", 11, "the carried stream 'v' is added to the hidden state 'h' without a weight: "
                                         "carried beside the hidden state, it joins it in every layer")]),
    ("mix * v", []),  # a learned weight: streams mixed, as hyper-connections do
])
def test_a_carried_stream_joins_the_hidden_state_only_through_a_weight(join: str, found: list) -> None:
    program = blockir.parse(CARRIED_JOIN.replace("JOIN", join), "t.block")
    assert [(d.code, d.span.line, d.message) for d in blockir.verify(program) if d.is_error] == found


SCORES_JOIN = (Path(__file__).parent / "failure_lab" / "35_score_residual_as_hidden.block").read_text()


@pytest.mark.parametrize("sign", ["+", "-", "*"])
def test_scores_combined_with_the_hidden_state_by_any_elementwise_op_are_reported(sign: str) -> None:
    """Each elementwise combination of two tensors (add, difference, product) joins scores to the stream."""
    program = blockir.parse(SCORES_JOIN.replace("  v = h + s", f"  v = h {sign} s"), "t.block")
    found = [(d.code, d.span.line, d.message) for d in blockir.verify(program) if d.code == "E0423"]
    assert found == [("E0423", 19, "attention scores 's' [B, H, S, S] join the hidden state 'h' [B, S, D]")]
