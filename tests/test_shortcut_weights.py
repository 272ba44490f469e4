"""Cumulative shortcut weights ∏_{j>i} a_j and the identity-route view, against a float64 unrolled stack.

The oracle unrolls ``x_{i+1} = a_i x_i + u_i`` in float64 with the a_i computed here from each file's
formula, and reads the weight of update i on the output as the autograd gradient d(Σ out)/d(u_i).
"""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest
import torch

import blockir
from blockir.analyses.manifest import program_manifest
from blockir.analyses.shortcut_weights import stack_weights
from blockir.cli import main
from blockir.reports.cost import format_ledger, ledger
from conftest import ROOT

LAYERED = """
dim B: batch
dim S: seq
dim D: model = 16
dim H: heads = 2
dim F: hidden = 2 * D

block Scaled(x: [B, S, D]) -> [B, S, D] {
  const a = 1 + 0.125 * layer
  const b = 0.75
  ln_1: layernorm(D)
  attn: self_attention(heads=H)
  ln_2: rmsnorm(D)
  mlp: mlp(F)
  h = a * x + attn(ln_1(x))
  y = b * h + mlp(ln_2(h))
  return y
}

model M(x: [B, S, D]) -> [B, S, D] {
  layers: Scaled * 5
  norm: layernorm(D)
  return norm(layers(x))
}
"""


def _unrolled(weights: list[float]) -> list[float]:
    """d(Σ x_L)/d(u_i) of x_{i+1} = a_i x_i + u_i, in float64 autograd."""
    us = [torch.zeros(3, dtype=torch.float64, requires_grad=True) for _ in weights]
    x = torch.ones(3, dtype=torch.float64)
    for a, u in zip(weights, us):
        x = a * x + u
    x.sum().backward()
    return [float(u.grad[0]) for u in us]  # type: ignore[index]


def test_layer_dependent_constants_match_the_unrolled_product() -> None:
    program = blockir.parse(LAYERED, "layered.block")
    (stack,) = stack_weights(program, program.block("M"))
    weights = [w for layer in range(5) for w in (1 + 0.125 * layer, 0.75)]
    assert [u.weight for u in stack.updates] == weights
    assert [u.later for u in stack.updates] == _unrolled(weights)
    assert [u.path for u in stack.updates[:3]] == ["layers.0.h", "layers.0.y", "layers.1.h"]
    assert [u.shortcut for u in stack.updates[:2]] == ["identity", "constant"]
    assert all(u.identity_route for u in stack.updates)
    assert stack.final_norm == "norm"


def test_deepnorm_product_and_post_ln_routes() -> None:
    program = blockir.load(ROOT / "examples" / "deepnorm.block")
    (stack,) = stack_weights(program, program.block("DeepNormDecoder"))
    alpha = (2 * 24) ** 0.25
    assert [u.later for u in stack.updates] == _unrolled([alpha] * 48)
    assert stack.updates[0].later == _unrolled([alpha] * 48)[0] and stack.updates[0].later > 5e19
    # every sum is normalized: only the stream after the last update reaches the output without a norm
    assert [u.identity_route for u in stack.updates] == [False] * 47 + [True]
    assert {u.post_norm for u in stack.updates} == {"ln_1", "ln_2"}


def test_rezero_and_layerscale_gate_the_branch_not_the_shortcut() -> None:
    rezero = blockir.load(ROOT / "examples" / "rezero.block")
    (stack,) = stack_weights(rezero, rezero.block("ReZeroModel"))
    assert {(u.shortcut, u.weight, u.later, u.branch_init, u.identity_route) for u in stack.updates} == \
        {("identity", 1.0, 1.0, 0.0, True)}
    ls = blockir.load(ROOT / "examples" / "layerscale.block")
    (stack,) = stack_weights(ls, ls.block("LayerScaleEncoder"))
    assert {(u.weight, u.later, u.branch_init) for u in stack.updates} == {(1.0, 1.0, 1e-5)}


def test_deepscalelm_lambda_product() -> None:
    program = blockir.load(ROOT / "examples" / "deepscalelm.block")
    (stack,) = stack_weights(program, program.block("DeepScaleLMDecoder"))
    lam, beta = (1 - 2 / 12) ** 0.5, (2 / 12) ** 0.5
    assert [u.later for u in stack.updates] == _unrolled([lam] * 24)
    assert {u.branch_init for u in stack.updates} == {beta}


def test_learned_and_interpolated_shortcuts_have_no_constant_weight() -> None:
    ngpt = blockir.load(ROOT / "examples" / "ngpt.block")
    (stack,) = stack_weights(ngpt, ngpt.block("NGPT"))
    assert {u.shortcut for u in stack.updates} == {"interpolation"}
    assert [u.later for u in stack.updates] == [None] * 15 + [1.0]
    gated = blockir.parse(LAYERED.replace("  const b = 0.75\n", "  g: scalar(init=0.5)\n")
                          .replace("b * h", "g * h"), "gated.block")
    (stack,) = stack_weights(gated, gated.block("M"))
    assert [u.shortcut for u in stack.updates[-2:]] == ["constant", "learned"]
    assert stack.updates[-1].later == 1.0 and stack.updates[-2].later is None
    assert [u.identity_route for u in stack.updates] == [False] * 9 + [True]


def test_manifest_and_cost_report_the_stack(tmp_path) -> None:
    program = blockir.parse(LAYERED, "layered.block")
    entry = program_manifest(program)["blocks"]["M"]["shortcut_weights"][0]
    expected = _unrolled([w for layer in range(5) for w in (1 + 0.125 * layer, 0.75)])
    assert entry["layers"] == 5 and [u["later_product"] for u in entry["updates"]] == expected
    text = format_ledger(ledger(program, "M", {"B": 2, "S": 4}))
    assert "shortcut weights of 'layers' (5 × Scaled, 10 updates): later products from " in text
    assert "identity route from 10 of 10 depths; final norm 'norm' on every route to the output" in text
    path = tmp_path / "layered.block"
    path.write_text(LAYERED)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["cost", str(path), "--dims", "B=2,S=4", "--format", "json"]) == 0
    data = json.loads(out.getvalue())["shortcut_weights"][0]
    expected = _unrolled([w for layer in range(5) for w in (1 + 0.125 * layer, 0.75)])
    assert data["summary"] == {"updates": 10, "identity_routes": 10, "later_product_min": min(expected),
                               "later_product_max": max(expected)}
    assert [u["later_product"] for u in data["updates"]] == expected


def test_a_deep_stack_of_alike_layers_is_summarised_from_one_layer(monkeypatch) -> None:
    from blockir.analyses import shortcut_weights
    from blockir.analyses.shortcut_weights import route_summary
    program = blockir.load(ROOT / "examples" / "deepscalelm.block")
    (stack,) = stack_weights(program, program.block("DeepScaleLMDecoder"))
    listed = route_summary(stack)
    monkeypatch.setattr(shortcut_weights, "LISTED", 0)  # the same stack, summarised from its pattern
    (stack,) = stack_weights(program, program.block("DeepScaleLMDecoder"))
    pattern = route_summary(stack)
    assert "updates" not in vars(stack)  # never unrolled
    assert pattern["updates"] == listed["updates"] == 24 and pattern["identity_routes"] == listed["identity_routes"]
    assert pattern["later_product_min"] == pytest.approx(listed["later_product_min"], rel=1e-14)
    assert pattern["later_product_max"] == listed["later_product_max"] == 1.0
    data = stack.data()
    assert data["layer_product"] == ((1 - 2 / 12) ** 0.5) ** 2 and len(data["layer_pattern"]) == 2
    deep = blockir.parse((ROOT / "examples" / "deepnorm.block").read_text().replace("* 24", "* 100000"), "d.block")
    (stack,) = stack_weights(deep, deep.block("DeepNormDecoder"))
    assert route_summary(stack) == {"updates": 200_000, "identity_routes": 1, "later_product_min": 1.0,
                                    "later_product_max": float("inf")}
