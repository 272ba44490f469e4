"""The derived tensor-parallel plan on real gloo process groups (CPU, loopback) against one process.

Forward output, input gradient and every parameter gradient (gathered from its
shards) must match the single-process module; placements show that the run
was really distributed the way the plan says.
"""
from __future__ import annotations

import pytest
import torch

from dist_harness import compare
from conftest import ROOT

LLAMA = str(ROOT / "examples" / "llama.block")
DIMS = {"B": 2, "S": 8, "D": 64}
# where the residual stream reaches each layer and the final norm
STREAM = {"replicated": "local", "sequence": "S(1)", "hidden": "S(2)"}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("layout", ["replicated", "sequence", "hidden"])
def test_llama_matches_one_process(layout: str) -> None:
    ref, par = compare(LLAMA, "LlamaModel", DIMS, layout, (2, 8, 64), world=2)
    assert _rel(par["y"], ref["y"]) <= 1e-5
    assert _rel(par["dx"], ref["dx"]) <= 1e-5
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert _rel(par["grads"][key], g) <= 1e-5, key
    # the plan ran: whole heads and MLP columns per rank, o/down split by rows, norms replicated
    params = par["params"]
    assert params["layers.0.self_attn.q_proj.weight"] == "S(0)"
    assert params["layers.1.mlp.down_proj.weight"] == "S(1)"
    expected_norm = "local" if layout == "replicated" else "R"
    assert params["norm.weight"] == params["layers.0.input_layernorm.weight"] == expected_norm
    assert par["inputs"]["layers.0"] == par["inputs"]["norm"] == STREAM[layout]


@pytest.mark.parametrize("layout", ["replicated", "sequence"])
def test_fsdp_and_tp_on_a_2x2_mesh(layout: str) -> None:
    """FSDP2 over dp and the derived plan over tp: each dp rank runs half the batch."""
    dims = {"B": 4, "S": 8, "D": 64}
    ref, par = compare(LLAMA, "LlamaModel", dims, layout, (4, 8, 64), world=4, dp=2)
    assert _rel(par["y"], ref["y"]) <= 1e-5
    assert _rel(par["dx"], ref["dx"]) <= 1e-5
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert _rel(par["grads"][key], g) <= 1e-5, key
    # every parameter is sharded over dp (dim 0); the plan's tp placements sit on the second mesh axis
    params = par["params"]
    assert all(p.startswith(("S(0)", "_S(0,")) for p in params.values()), params
    assert params["layers.0.self_attn.q_proj.weight"].endswith(",S(0)")
    assert params["layers.1.mlp.down_proj.weight"] == "S(0),S(1)"
