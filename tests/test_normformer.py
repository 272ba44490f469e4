"""NormFormer (arXiv:2110.09456): its equations in float64, its keys, and its place in the topology registry.

    h = x + LN_a(HeadScaleMHA(LN_1(x)))       HeadScaleMHA: head i's output times gamma_i, then W_O
    y = h + W_2 LN_f(gelu(W_1 LN_2(h) + b_1)) + b_2
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import blockir
from blockir.analyses.classify import classify_program
from blockir.analyses.keys import param_keys
from blockir.ir.printer import format_program
from conftest import ROOT
from reference_attention import causal_attention
from oracle import assert_matches_reference

EXAMPLE = ROOT / "examples" / "normformer.block"
DIMS = {"D": 16, "F": 32}
HEADS, WIDTH = 4, 16


def _ln(x: Tensor, p: dict[str, Tensor], name: str) -> Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * p[f"{name}.weight"] + p[f"{name}.bias"]


def _reference(x: Tensor, p: dict[str, Tensor]) -> Tensor:
    h = x + _ln(causal_attention(_ln(x, p, "self_attn_layer_norm"), p, "self_attn", HEADS), p, "attn_ln")
    inner = F.gelu(_ln(h, p, "final_layer_norm") @ p["fc1.weight"].T + p["fc1.bias"])
    return h + _ln(inner, p, "ffn_layernorm") @ p["fc2.weight"].T + p["fc2.bias"]


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_normformer_layer_is_its_equations(backend: str) -> None:
    # statistics in float64 too, so the comparison is exact to rounding
    prog = blockir.parse(EXAMPLE.read_text().replace("layernorm(D)", "layernorm(D, accum=f64)")
                         .replace("layernorm(F)", "layernorm(F, accum=f64)"), str(EXAMPLE))
    m = blockir.compile(prog, "NormFormerLayer", backend=backend, dims=DIMS, seed=0, dtype=torch.float64)
    assert_matches_reference(m, _reference, (2, 5, WIDTH))
    assert "self_attn.head_scale" in [n for n, _ in m.named_parameters()]


def test_head_scales_start_at_one_and_have_a_key_per_head() -> None:
    prog = blockir.load(EXAMPLE)
    keys = param_keys(prog, "NormFormerLayer").shapes
    assert keys["self_attn.head_scale"] == (4,)
    assert keys["ffn_layernorm.weight"] == (256,)
    m = blockir.compile(prog, "NormFormerLayer", seed=0)
    assert torch.equal(m.state_dict()["self_attn.head_scale"], torch.ones(4))


def test_normformer_classifies_without_a_placement_warning() -> None:
    prog = blockir.parse(EXAMPLE.read_text(), str(EXAMPLE))
    assert blockir.verify(prog) == []
    classes = classify_program(prog)
    assert classes["NormFormerLayer"].topology == "normformer"
    assert classes["NormFormerModel"].members[0].topology == "normformer"
    assert blockir.parse(format_program(prog), str(EXAMPLE)) == prog


def test_normformer_graph_without_head_scales_is_an_error() -> None:
    text = EXAMPLE.read_text().replace(", head_scale=true", "")
    diags = blockir.verify(blockir.parse(text, "n.block"))
    assert [(d.code, d.span.line) for d in diags] == [("E0440", 23)]
    assert diags[0].message == "'NormFormerLayer' is NormFormer but lacks per-head scales on 'self_attn' " \
                               "(head_scale=true)"


def test_tensor_parallel_plan_splits_head_scales_with_their_heads() -> None:
    from blockir.analyses.parallel import derive_plan
    from blockir.analyses.sizes import Sizes
    prog = blockir.load(EXAMPLE)
    plan = derive_plan(prog, prog.block("NormFormerLayer"), Sizes.of(prog, {"B": 2, "S": 4}), "sequence", 2)
    assert plan.params["self_attn.head_scale"] == "shard(0)"
    assert plan.params["self_attn.q_proj.weight"] == "shard(0)"
