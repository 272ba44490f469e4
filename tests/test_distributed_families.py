"""Imported causal LMs (tiny HF configs, token ids in, logits out) parallelised at tp=2 on real gloo ranks.

The families cover what the importer writes: grouped key/value heads and a tied head (Qwen2), GPT-2's
transposed Conv1D weights with q, k, v stacked in one matrix and a tied head, GPT-NeoX's per-head
interleaved q, k, v, Phi-3's stacked q, k, v with grouped heads and stacked gate/up, OLMo-2's q/k norms over
the whole width. Logits and every parameter gradient must equal the single-process module, and each stacked
layer must issue exactly the plan's forward collectives and, counted while its backward runs, exactly the
plan's backward ones. LLaMA (untied head) and GPT-2 (tied) also run with
the embedding and head split by vocabulary, trained through ``run``'s loss under ``loss_parallel``. All cases
share one spawned world of two ranks.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from blockir.api import hf_block_text as block_text
from dist_harness import compare
from hf_configs import CONFIGS

MODELS = {"qwen2": "Qwen2ForCausalLM", "gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM",
          "phi3": "Phi3ForCausalLM", "olmo2": "Olmo2ForCausalLM"}
LAYOUTS = ("replicated", "sequence", "hidden")
CASES = [(model, layout) for model in MODELS for layout in LAYOUTS]
STREAM = {"replicated": "local", "sequence": "S(1)", "hidden": "S(2)"}
# vocab-parallel cases: a vocabulary of 64 splits over two ranks, and the token ids (below 50) hit both halves
VOCAB_MODELS = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}
VOCAB_CASES = [(model, layout, "vocab") for model in VOCAB_MODELS for layout in LAYOUTS]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[Any, Any]]:
    folder = tmp_path_factory.mktemp("families")
    files = {}
    for model in MODELS:
        files[model] = folder / f"{model}.block"
        files[model].write_text(block_text(CONFIGS[model]))
    for model in VOCAB_MODELS:
        files[model, "vocab"] = folder / f"{model}-vocab.block"
        files[model, "vocab"].write_text(block_text(dict(CONFIGS[model], vocab_size=64)))
    cases = [(str(files[model]), MODELS[model], {"B": 2, "S": 8}, layout, (2, 8), "eval", 1) for model, layout in CASES]
    cases += [(str(files[model, "vocab"]), VOCAB_MODELS[model], {"B": 2, "S": 8}, layout, (2, 8), "eval", 1, True)
              for model, layout, _ in VOCAB_CASES]
    return dict(zip(CASES + VOCAB_CASES, compare(cases, world=2)))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # 1e-5 relative in fp32; the floor is for gradients that are zero in exact arithmetic (a key bias)
    return (a - b).norm().item() <= 1e-5 * b.norm().item() + 1e-6


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_an_imported_family_matches_one_process(world: dict, case: tuple[str, str]) -> None:
    ref, par = world[case]
    assert _close(par["y"], ref["y"])
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert _close(par["grads"][key], g), key
    assert par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]
    layers = next(k for k in par["inputs"] if k.endswith("layers") or k.endswith(".h"))
    assert par["inputs"][layers] == STREAM[case[1]]


def _placements(world: dict, model: str, layout: str = "sequence") -> dict[str, str]:
    return world[(model, layout)][1]["params"]


def test_a_tied_head_keeps_one_table_computed_on_full_rows(world: dict) -> None:
    for model in ("qwen2", "gpt2"):
        params = _placements(world, model)
        embedding = next(k for k in params if k.endswith(("embed_tokens.weight", "wte.weight")))
        assert params[embedding] == "local"
        assert not any(k.startswith("lm_head") for k in params)  # the head's weight is the embedding's


def test_fused_matrices_are_split_by_their_head_groups(world: dict) -> None:
    gpt2, neox, phi3 = (_placements(world, m) for m in ("gpt2", "gpt_neox", "phi3"))
    # GPT-2's Conv1D stores [in, out]: the MLP's columns are dim 1, the output projection's rows dim 0
    assert gpt2["transformer.h.0.mlp.c_fc.weight"] == "S(1)" and gpt2["transformer.h.0.mlp.c_fc.bias"] == "S(0)"
    assert gpt2["transformer.h.0.mlp.c_proj.weight"] == gpt2["transformer.h.0.attn.c_proj.weight"] == "S(0)"
    # a stacked q/k/v (or gate/up) stays whole: a rank's columns are three (two) blocks of it
    assert gpt2["transformer.h.0.attn.c_attn.weight"] == phi3["model.layers.0.self_attn.qkv_proj.weight"] == "R"
    assert phi3["model.layers.0.mlp.gate_up_proj.weight"] == "R"
    # per head q, k, v in turn: a rank's heads are one contiguous block
    assert neox["gpt_neox.layers.0.attention.query_key_value.weight"] == "S(0)"


def test_a_q_k_norm_over_the_whole_width_is_split_with_the_heads(world: dict) -> None:
    params = _placements(world, "olmo2")
    assert params["model.layers.0.self_attn.q_norm.weight"] == params["model.layers.1.self_attn.k_norm.weight"] == "S(0)"
    planned = world[("olmo2", "replicated")][1]["planned"]["model.layers.0"]
    # the row moments of q and of k: one all-reduce of Σx² per row each (B·S = 16), beside the stream's two
    assert planned[("all-reduce", 16)] == 2 and planned[("all-reduce", 2 * 8 * 64)] == 2


# the embedding's pending sum reduced onto the stream, the head's input gathered to full rows; B·S·D = 2·8·64
TABLES = {"replicated": ([("all-reduce", 1024)], []),
          "sequence": ([("reduce-scatter", 1024)], [("all-gather", 1024)]),
          "hidden": ([("reduce-scatter", 1024)], [("all-gather", 1024)])}


@pytest.mark.parametrize("case", VOCAB_CASES, ids="-".join)
def test_a_vocab_parallel_model_trains_as_one_process(world: dict, case: tuple[str, str, str]) -> None:
    ref, par = world[case]
    assert _close(par["y"], ref["y"])
    assert abs(par["loss"].item() - ref["loss"].item()) <= 1e-5 * ref["loss"].item()
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert _close(par["grads"][key], g), key
    assert par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]
    model, layout = case[:2]
    embedding, head = ("transformer.wte", "lm_head") if model == "gpt2" else ("model.embed_tokens", "lm_head")
    assert [(k, e) for (k, e), n in par["comms"][embedding].items() for _ in range(n)] == TABLES[layout][0]
    assert [(k, e) for (k, e), n in par["comms"][head].items() for _ in range(n)] == TABLES[layout][1]
    # backward: the embedding's reduction gathers the gradient (an all-reduce sends none back); the head's
    # pending input gradient is reduced to the stream's layout
    gathered = [] if layout == "replicated" else [("all-gather", 1024)]
    assert [(k, e) for (k, e), n in par["comms_backward"][embedding].items() for _ in range(n)] == gathered
    assert [(k, e) for (k, e), n in par["comms_backward"][head].items() for _ in range(n)] == TABLES[layout][0]
    params = par["params"]
    assert params[f"{embedding}.weight"] == "S(0)"
    if model == "gpt2":  # tied: one table, split once, that the head reads too
        assert not any(k.startswith("lm_head") for k in params)
    else:
        assert params["lm_head.weight"] == "S(0)"


# one layer's backward, counted (B·S·D = 2·8·64 = 1024; B·S = 16 rows): each branch input's pending gradient
# reduced once, each reduce-scatter's gradient gathered; a feature-sharded RMSNorm's DTensor backward
# reduce-scatters its input gradient, LayerNorm's own sharded path all-reduces Σg and Σg·x̂ and gathers its
# gain's and shift's gradient slices; OLMo-2's q/k norms over the width (64 and 32 features) reduce-scatter theirs
BACKWARD = {("qwen2", "replicated"): {("all-reduce", 1024): 2},
            ("qwen2", "sequence"): {("all-gather", 1024): 2, ("reduce-scatter", 1024): 2},
            ("qwen2", "hidden"): {("all-gather", 1024): 2, ("reduce-scatter", 1024): 4},
            ("gpt2", "hidden"): {("all-gather", 1024): 2, ("reduce-scatter", 1024): 2, ("all-gather", 64): 4,
                                 ("all-reduce", 32): 2},
            ("olmo2", "replicated"): {("all-reduce", 1024): 2, ("reduce-scatter", 1024): 1, ("reduce-scatter", 512): 1}}


@pytest.mark.parametrize("case", BACKWARD, ids="-".join)
def test_a_layers_backward_sends_the_duals_of_its_forward(world: dict, case: tuple[str, str]) -> None:
    layer = next(iter(world[case][1]["comms_backward"]))
    assert world[case][1]["comms_backward"][layer] == BACKWARD[case]
