"""The derived tensor-parallel plan on real gloo process groups (CPU, loopback) against one process.

Forward output, input gradient and every parameter gradient (gathered from its
shards) must match the single-process module, in evaluation and in training
with dropout and drop_path active (the masks are keyed by logical coordinates,
so a rank holding a slice draws the unsharded run's decisions there);
placements show that the run was really distributed the way the plan says.
All cases of one world size share one spawned process group.
"""
from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from conftest import ROOT
from dist_harness import Comparison, World, compare, data_ranks, start_alongside

LLAMA = str(ROOT / "examples" / "llama.block")
FAMILIES = str(ROOT / "tests" / "distributed" / "families.block")
MODELS = {"llama": (LLAMA, "LlamaModel"), "gpt2": (FAMILIES, "GPT2Model"),
          "neox": (FAMILIES, "GPTNeoXModel"), "bert": (FAMILIES, "BertEncoder"), "heads": (FAMILIES, "HeadParamsModel"),
          "qvk": (FAMILIES, "QVKGroupsModel"),
          "stated": (str(ROOT / "tests" / "distributed" / "stated_attention_dropout.block"), "StatedModel")}
LAYOUTS = ("replicated", "sequence", "hidden")
# where the residual stream reaches each layer
STREAM = {"replicated": "local", "sequence": "S(1)", "hidden": "S(2)"}
# (model, layout, mode, dp) run over two ranks; LLaMA and the per-head model have no dropout, so training would repeat eval
WORLD2 = [(model, layout, "eval", 1) for model in ("llama", "heads") for layout in LAYOUTS] + \
    [(model, layout, mode, 1) for model in ("gpt2", "neox", "bert") for layout in LAYOUTS for mode in ("eval", "train")] + \
    [("stated", "sequence", mode, 1) for mode in ("eval", "train")]  # its file's own layout, attention dropout on
# over four ranks: FSDP2 over dp with the plan over tp on a 2×2 mesh, and LLaMA's 2 key/value heads over tp=4
# GPT-2 trains with dropout there too: each dp rank keys its masks by its rows of the global batch
# the fused backend (add+norm boundaries as custom ops, with DTensor rules where whole rows are split; composed
# with the norm's feature-sharded path under hidden sharding)
FUSED = [(model, layout, mode, 1, "fused") for model in ("llama", "gpt2") for layout in LAYOUTS
         for mode in ("eval",) + (("train",) if model == "gpt2" else ())]
# an imported GPT-2 causal LM (token ids in, logits out) under hidden sharding, fused and fx, in eval and training
# with dropout on every residual branch and on the attention probabilities
IMPORTED = [("gpt2-lm", "hidden", mode, 1, backend) for mode in ("eval", "train") for backend in ("fused", "fx")]
WORLD4 = [("llama", layout, "eval", 2) for layout in LAYOUTS] + [("gpt2", "hidden", mode, 2) for mode in ("eval", "train")] + \
    [("llama", layout, "eval", 1) for layout in ("sequence", "hidden")]
# FSDP2 over the fused LLaMA, whose layers the fused backend inlined into the model's graph
FUSED_DP = [("llama", layout, "eval", 2, "fused") for layout in ("sequence", "hidden")]
# HSDP on ("dp_replicate", "dp_shard", "tp") meshes: two replicas of two shards, and two replicas of the plan over
# tp=2 (GPT-2 training with dropout: four data-parallel slices draw one process's masks); FSDP2 mixed precision
HSDP = [("llama", "sequence", "eval", (2, 2)), ("gpt2", "sequence", "train", (2, 1))]
MIXED = [("llama", "sequence", "eval-bf16", 2)]
# CodeGen-style q/v/k in 2 row groups over tp=4, training with dropout: each rank's head is half a group
GROUPS = [("qvk", "hidden", "train", 1)]
# the fused backend over four ranks: LLaMA at tp=4 (its key/value heads replicated), GPT-2 training under HSDP
FUSED4 = [("llama", layout, "eval", 1, "fused") for layout in ("sequence", "hidden")] + \
    [("gpt2", "sequence", "train", (2, 1), "fused")]
# and an imported LLaMA causal LM with its embedding and head split by vocabulary, trained on the 2×2 mesh
VOCAB_DP = ("llama-lm", "sequence", "vocab", 2)


def _case(model: str, layout: str, mode: str, dp: Any, backend: str = "fx") -> tuple[Any, ...]:
    program, name = MODELS[model]
    batch = 2 * data_ranks(dp)
    case = program, name, {"B": batch, "S": 8, "D": 64}, layout, (batch, 8, 64), mode, dp
    return case + ((False, backend) if backend != "fx" else ())


def _imported(path: str, layout: str, mode: str, dp: int, backend: str) -> tuple[Any, ...]:
    return path, "GPT2LMHeadModel", {"B": 2, "S": 8}, layout, (2, 8), mode, dp, False, backend


@pytest.fixture(scope="module")
def world2(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> dict[tuple[Any, ...], tuple[Any, Any]]:
    start_alongside(request, "started4", "world4")  # the four-rank world runs alongside this one
    from blockir.api import hf_block_text
    from hf_configs import CONFIGS
    lm = tmp_path_factory.mktemp("fused") / "gpt2.block"
    lm.write_text(hf_block_text(CONFIGS["gpt2"]))
    cases = [_case(*c) for c in WORLD2 + FUSED] + [_imported(str(lm), *c[1:]) for c in IMPORTED]
    return dict(zip(WORLD2 + FUSED + IMPORTED, compare(cases, world=2)))


@pytest.fixture(scope="module")
def world4(started4: tuple[list[Any], Comparison]) -> dict[tuple[Any, ...], tuple[Any, Any]]:
    keys, comparison = started4
    return dict(zip(keys, comparison.result()))


@pytest.fixture(scope="module")
def started4(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], Comparison]:
    from blockir.api import hf_block_text
    from hf_configs import CONFIGS
    lm = tmp_path_factory.mktemp("vocab") / "llama.block"
    lm.write_text(hf_block_text(dict(CONFIGS["llama"], vocab_size=64, num_hidden_layers=1)))
    vocab = (str(lm), "LlamaForCausalLM", {"B": 4, "S": 8}, "sequence", (4, 8), "eval", 2, True)
    cases = WORLD4 + HSDP + MIXED + FUSED_DP + GROUPS + FUSED4
    return cases + [VOCAB_DP], Comparison([_case(*c) for c in cases] + [vocab], world=4)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # 1e-5 relative; the floor is for the key-projection bias, whose gradient is zero in exact arithmetic
    # (softmax ignores a shift shared by every key of a query) and only rounding noise of 1e-7 in fp32
    return (a - b).norm().item() <= 1e-5 * b.norm().item() + 1e-6


def _matches(ref: dict[str, Any], par: dict[str, Any]) -> None:
    assert _close(par["y"], ref["y"])
    assert _close(par["dx"], ref["dx"])
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert _close(par["grads"][key], g), (key, _rel(par["grads"][key], g))


@pytest.mark.parametrize("case", WORLD2, ids=lambda c: "-".join(map(str, c[:3])))
def test_tensor_parallel_matches_one_process(world2: dict, case: tuple[Any, ...]) -> None:
    layout = case[1]
    ref, par = world2[case]
    _matches(ref, par)
    # the plan ran: whole heads and MLP columns per rank, the output projections split by rows
    params = par["params"]
    first = next(k for k in params if k.endswith("q_proj.weight"))
    assert params[first] == "S(0)"
    assert sum(k.endswith(("o_proj.weight", "down_proj.weight", "fc2.weight")) and v == "S(1)"
               for k, v in params.items()) == 4
    # a row-parallel output's bias is one replicated parameter, added once after the reduction
    assert all(v == "R" for k, v in params.items() if k.endswith(("o_proj.bias", "fc2.bias")))
    layer = next(k for k in par["inputs"] if k.endswith(".0"))
    assert par["inputs"][layer] == STREAM[layout]
    # every layer issued exactly the collectives, and payloads, the plan predicts for it
    assert sum(k.rsplit(".", 1)[-1].isdigit() for k in par["comms"]) == 2
    if case[0] == "heads":
        # q/k norm gains replicated with their gradients summed, nGPT's s_qk split with the query heads
        assert params["layers.0.self_attn.q_norm.weight"] == params["layers.1.self_attn.k_norm.weight"] == "R"
        assert params["layers.0.self_attn.qk_scale"] == "S(0)"
        # Fixup's scalar biases inside the branches: replicated, each rank's partial gradient summed
        assert params["layers.1.self_attn.fixup_bias_out"] == params["layers.0.mlp.fixup_bias_act"] == "R"
    # Post-LN included: under hidden sharding every LayerNorm reduces its row sums, so the stream stays
    # feature-sharded through the norm that produces it
    assert par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]
    if layout == "hidden":
        assert all(par["inputs"][k] == "S(2)" for k in par["inputs"] if k.rsplit(".", 1)[-1].isdigit())


@pytest.mark.parametrize("case", FUSED, ids=lambda c: "-".join(map(str, c[:3])))
def test_the_fused_backend_matches_one_fused_process_and_fx(world2: dict, case: tuple[Any, ...]) -> None:
    """The fused add+norm ops run on the rows each rank holds, and a feature-sharded stream's norms reduce their
    row sums: output, input and parameter gradients match the fused module on one process, which matches the
    fx module (the same masks in training), and the step issues exactly what the fx backend's does."""
    ref, par = world2[case]
    _matches(ref, par)
    fx, fx_par = world2[case[:4]]
    _matches(fx, ref)
    params = par["params"]
    assert params[next(k for k in params if k.endswith("q_proj.weight"))] == "S(0)"
    # a sharded stream meets replicated norm parameters: the fused backward sums their gradients over the rows
    # of a sequence-sharded stream, the feature-sharded norm gathers their slices
    norms = [v for k, v in params.items() if k.endswith(("layernorm.weight", "ln_1.weight", "ln_2.weight"))]
    assert norms and all(v == ("local" if case[1] == "replicated" else "R") for v in norms)
    # the fx run's per-layer collectives are the plan's (above); the fused step's, wherever they run, are the fx step's
    assert par["totals"] == fx_par["totals"]
    if case[0] == "gpt2":  # LLaMA's fused boundaries join its layers into one graph, which calls no layer module
        assert par["inputs"]["h.0"] == STREAM[case[1]]
        assert par["comms"] == par["planned"]
        assert par["comms_backward"] == par["planned_backward"]


@pytest.mark.parametrize("case", IMPORTED[::2], ids=lambda c: c[2])
def test_an_imported_gpt2_runs_fused_under_hidden_sharding(world2: dict, case: tuple[Any, ...]) -> None:
    """GPT-2's LayerNorms at fused add+norm boundaries over a feature-sharded stream: logits and every
    gradient match the fused module on one process and the fx one; every layer, the final norm, the
    embedding and the head issue the plan's collectives, forward and backward."""
    ref, par = world2[case]
    fx, fx_par = world2[(*case[:4], "fx")]
    for a, b in ((par, ref), (ref, fx)):
        assert _close(a["y"], b["y"])
        assert set(a["grads"]) == set(b["grads"])
        for key, g in b["grads"].items():
            assert _close(a["grads"][key], g), (key, _rel(a["grads"][key], g))
    assert par["inputs"]["transformer.h"] == "S(2)"
    assert par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]
    assert par["totals"] == fx_par["totals"]
    if case[2] == "train":
        assert _rel(ref["y"], world2[IMPORTED[0]][0]["y"]) > 1e-2


@pytest.mark.parametrize("model", ["gpt2", "neox", "bert", "stated"])
def test_training_runs_really_drop(world2: dict, model: str) -> None:
    """The training reference differs from evaluation, so the masks above are compared, not skipped."""
    for layout in LAYOUTS if model != "stated" else ("sequence",):
        train, _ = world2[(model, layout, "train", 1)]
        evaluated, _ = world2[(model, layout, "eval", 1)]
        assert _rel(train["y"], evaluated["y"]) > 1e-2


@pytest.mark.parametrize("case", WORLD4[:5], ids=lambda c: "-".join(map(str, c[:3])))
def test_fsdp_and_tp_on_a_2x2_mesh(world4: dict, case: tuple[Any, ...]) -> None:
    """FSDP2 over dp and the derived plan over tp: each dp rank runs half the batch."""
    ref, par = world4[case]
    _matches(ref, par)
    # every parameter is sharded over dp (dim 0); the plan's tp placements sit on the second mesh axis
    params = par["params"]
    assert all(p.startswith(("S(0)", "_S(0,")) for p in params.values()), params
    assert params[next(k for k in params if k.endswith("q_proj.weight"))].endswith(",S(0)")
    assert params[next(k for k in params if k.endswith(("down_proj.weight", "fc2.weight")))] == "S(0),S(1)"


def test_data_parallel_training_draws_the_whole_batchs_masks(world4: dict) -> None:
    """The (dp, tp) training run above matched one process on the whole batch; it really dropped."""
    train, _ = world4[("gpt2", "hidden", "train", 2)]
    evaluated, _ = world4[("gpt2", "hidden", "eval", 2)]
    assert _rel(train["y"], evaluated["y"]) > 1e-2


def test_fsdp_and_a_vocab_parallel_plan_train_as_one_process_on_the_whole_batch(world4: dict) -> None:
    """Each dp rank trains on half the windows through ``run``'s loss under ``loss_parallel``; the mean of
    their losses and the dp-averaged gradients are those of one process on all of them."""
    ref, par = world4[VOCAB_DP]
    assert _close(par["y"], ref["y"])
    assert abs(par["loss"].item() - ref["loss"].item()) <= 1e-5 * ref["loss"].item()
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert _close(par["grads"][key], g), (key, _rel(par["grads"][key], g))
    # the tables are split over dp by FSDP and by vocabulary rows over tp
    assert par["params"]["model.embed_tokens.weight"] == par["params"]["lm_head.weight"] == "_S(0, 2),S(0)"


@pytest.mark.parametrize("case", WORLD4[5:], ids=lambda c: c[1])
def test_llama_over_four_ranks_replicates_key_value_heads(world4: dict, case: tuple[Any, ...]) -> None:
    """Two key/value heads over four ranks: each rank keeps the whole k/v weight and computes its head."""
    ref, par = world4[case]
    _matches(ref, par)
    params = par["params"]
    assert params["layers.0.self_attn.q_proj.weight"] == "S(0)"
    assert params["layers.0.self_attn.k_proj.weight"] == params["layers.1.self_attn.v_proj.weight"] == "R"
    assert par["inputs"]["layers.0"] == STREAM[case[1]]
    assert par["comms"] == par["planned"]


def test_q_v_k_row_groups_over_more_ranks_than_groups(world4: dict) -> None:
    """Two row groups of [q; v; k] over four ranks: the matrix stays whole and each rank computes the q, v and k
    columns of its own head (half a group), one group of its own; training with dropout matches one process, and
    every layer issues the plan's collectives, forward and backward."""
    ref, par = world4[GROUPS[0]]
    _matches(ref, par)
    params = par["params"]
    assert params["h.0.attn.qkv_proj.weight"] == params["h.1.attn.qkv_proj.weight"] == "R"
    assert params["h.0.attn.out_proj.weight"] == "S(1)"
    assert par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]


@pytest.mark.parametrize("case", FUSED_DP, ids=lambda c: c[1])
def test_fsdp_shards_a_fused_module_whose_layers_were_inlined(world4: dict, case: tuple[Any, ...]) -> None:
    """The fused LLaMA's layers never run as modules: FSDP2's units are the branches its graph calls, the fused
    boundaries' norms stay with the root; each dp rank runs half the batch as one fused process runs all of it."""
    ref, par = world4[case]
    _matches(ref, par)
    params = par["params"]
    assert all(p.startswith(("S(0)", "_S(0,")) for p in params.values()), params
    assert params["layers.1.self_attn.q_proj.weight"].endswith(",S(0)")
    assert params["layers.0.post_attention_layernorm.weight"] == "S(0),R"


@pytest.mark.parametrize("case", FUSED4, ids=lambda c: "-".join(map(str, c[:4])))
def test_the_fused_backend_over_four_ranks_matches_one_fused_process_and_fx(world4: dict, case: tuple[Any, ...]
                                                                           ) -> None:
    """At tp=4 and under HSDP the fused ops compose as over two ranks: output, input and parameter gradients
    match the fused module on one process, which matches the fx module; at tp=4 the step sends exactly what the fx
    step sends, and under HSDP every parameter is replicated over dp_replicate and sharded over dp_shard."""
    ref, par = world4[case]
    _matches(ref, par)
    fx, fx_par = world4[case[:4]]
    _matches(fx, ref)
    if case[3] == 1:
        assert par["totals"] == fx_par["totals"] and par["totals"][1]
        assert par["params"]["layers.0.self_attn.k_proj.weight"] == "R"
    else:
        assert all(p.startswith(("R,S(0),", "R,_S(0,")) for p in par["params"].values()), par["params"]


@pytest.mark.parametrize("case", HSDP, ids=lambda c: "-".join(map(str, c[:3])))
def test_hsdp_on_a_replicate_shard_tp_mesh(world4: dict, case: tuple[Any, ...]) -> None:
    """FSDP2 shards over dp_shard and replicates over dp_replicate; the four data slices of (2, 2) and the two
    of (2, 1) with the plan over tp=2 together give one process's result on the whole batch."""
    ref, par = world4[case]
    _matches(ref, par)
    params = par["params"]
    # HSDP placements: replicated over the first data axis, sharded (or strided) over the second, then tp
    assert all(p.startswith(("R,S(0),", "R,_S(0,")) for p in params.values()), params
    if case[3][1] == 1:  # the plan's own placements on the tp axis
        assert params[next(k for k in params if k.endswith("q_proj.weight"))].endswith(",S(0)")
        assert params[next(k for k in params if k.endswith("fc2.weight"))].endswith(",S(1)")
        # training really dropped: the whole batch's masks, drawn by two data-parallel slices
        assert _rel(par["y"], world4[("gpt2", "hidden", "eval", 2)][0]["y"]) > 1e-2


def test_fsdp_mixed_precision_composes_with_the_plan(world4: dict) -> None:
    """bf16 compute with fp32 master weights and fp32 gradient reduction: within bf16's rounding of fp32."""
    ref, par = world4[MIXED[0]]
    assert 0 < _rel(par["y"], ref["y"]) < 2e-2
    for key, g in ref["grads"].items():
        assert par["grads"][key].dtype == torch.float32
        assert _rel(par["grads"][key], g) < 5e-2, key


def test_a_world_that_does_not_finish_in_time_is_killed() -> None:
    """A hung world fails its tests instead of hanging the suite: past its deadline it raises, its ranks killed."""
    world = World(time.sleep, 2, 600, timeout=2)
    with pytest.raises(TimeoutError, match="the 2-rank world did not finish within 2 s"):
        world.result()
    assert not any(p.is_alive() for p in world.ranks.processes)
