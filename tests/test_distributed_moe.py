"""Mixtures of experts imported from tiny HF configs (Mixtral; Qwen2-MoE with its gated shared expert),
parallelised at tp=2 on real gloo ranks with tensor parallelism inside the experts.

Every layout runs in eval (the context layout with every expert whole on each rank, routing its own rows), and
one training case besides: logits and every parameter gradient (the
replicated router's and shared-expert gate's included, whose gradients are pending sums over the ranks)
equal the single-process module, and each stacked layer issues exactly the plan's forward and backward
collectives — one gather of the branch input and one reduction of the experts' sum per branch. All cases
share one spawned world of two ranks.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from blockir.api import hf_block_text as block_text
from dist_harness import compare
from hf_configs import CONFIGS

MODELS = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}
LAYOUTS = ("replicated", "sequence", "hidden", "context")
CASES = [(model, layout, "eval") for model in MODELS for layout in LAYOUTS] + [("qwen2_moe", "sequence", "train")]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], tuple[Any, Any]]:
    folder = tmp_path_factory.mktemp("moe")
    files = {}
    for model in MODELS:
        files[model] = folder / f"{model}.block"
        files[model].write_text(block_text(CONFIGS[model]))
    cases = [(str(files[model]), MODELS[model], {"B": 2, "S": 8}, layout, (2, 8), mode, 1)
             for model, layout, mode in CASES]
    return dict(zip(CASES, compare(cases, world=2)))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a - b).norm().item() <= 1e-5 * b.norm().item()


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_a_mixture_of_experts_matches_one_process(world: dict, case: tuple[str, str, str]) -> None:
    ref, par = world[case]
    assert _close(par["y"], ref["y"])
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert _close(par["grads"][key], g), key
    assert par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]


def test_the_tokens_reach_several_experts_and_every_moe_weight_learns(world: dict) -> None:
    """The comparison is not vacuous: each layer routes rows to more than one expert, and the router's, the
    experts' and the shared expert's gradients are nonzero."""
    ref, _ = world["qwen2_moe", "sequence", "train"]
    for i in range(2):
        mlp = f"model.layers.{i}.mlp."
        down = ref["grads"][mlp + "experts.down_proj"]
        assert (down.flatten(1).norm(dim=1) > 0).sum() >= 2
        for key in ("gate.weight", "experts.gate_up_proj", "shared_expert.up_proj.weight", "shared_expert_gate.weight"):
            assert ref["grads"][mlp + key].norm() > 0, key


def test_experts_are_split_by_hidden_units_and_the_router_replicated(world: dict) -> None:
    params = world["qwen2_moe", "hidden", "eval"][1]["params"]
    mlp = "model.layers.0.mlp."
    assert {k[len(mlp):]: v for k, v in params.items() if k.startswith(mlp)} == {
        "gate.weight": "R", "experts.gate_up_proj": "_S(1, 2)", "experts.down_proj": "S(2)",
        "shared_expert.gate_proj.weight": "S(0)", "shared_expert.up_proj.weight": "S(0)",
        "shared_expert.down_proj.weight": "S(1)", "shared_expert_gate.weight": "R"}
