"""Backward traffic of the derived plan against a hand-written torchtitan-style plan, counted by CommDebugMode.

Both plans parallelise the same compiled LLaMA (examples/llama.block) over two gloo ranks under sequence
parallelism; ``benchmarks/distributed.py`` owns the hand-written plan and the counter, and prints the same
comparison at larger sizes. Each branch's input gradient is reduced once, however many projections read
the branch input, so the derived plan moves no more than the hand-written one, forward or backward. The
causal LM around that decoder, its embedding and head split by vocabulary and its next-token loss under
``loss_parallel``, sends exactly what torchtitan's hand-written plan sends. Under every layout the counts,
forward and backward, are those ``blockir plan`` lists. A causal LM of each family with a hand-written plan
of its own in ``benchmarks/hand_plans.py`` (torchtitan's layer, HF's packed and gathering styles) sends no more
than that plan under either layout, and both plans give one process's loss.
"""
from __future__ import annotations

import importlib.util
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from conftest import ROOT
from dist_harness import run_world

DIMS = {"B": 2, "S": 8}


def _benchmark() -> Any:
    spec = importlib.util.spec_from_file_location("distributed_benchmark", ROOT / "benchmarks" / "distributed.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


# a family for each hand-written layer plan (benchmarks/hand_plans.py; the benchmark runs the others on LLaMA's):
# LLaMA's layer, GPT-2's Conv1D and packed c_attn, GPT-NeoX's per-head q/k/v, Phi-3's stacked q/k/v (gathered, as
# HF's tp_plan does) and packed gate/up, OLMo-2's gathered q/k/v, CodeGen's row groups; Gemma's scaled table; the
# mixtures of experts split inside every expert, Qwen2-MoE's with its gated shared expert; and the decoder layer's
# variants: GLM's packed gate/up, Arcee's MLP of up and down alone, Cohere's one norm feeding both branches,
# Gemma-2's norms on the branches' outputs too
FAMILIES = ("llama", "gpt2", "gpt_neox", "phi3", "olmo2", "codegen", "gemma", "mixtral", "qwen2_moe", "glm", "arcee",
            "cohere", "gemma2")


def _body() -> dict[str, Any]:
    """What rank 0 of the two-rank world reports."""
    import blockir
    from torch.distributed.device_mesh import init_device_mesh
    bench = _benchmark()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    program = str(ROOT / "examples" / "llama.block")
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0))
    results = {}
    for layout in ("replicated", "sequence", "hidden"):
        m = blockir.compile(program, "LlamaModel", dims=DIMS, seed=0)
        blockir.parallelize(m, mesh, program, "LlamaModel", layout=layout, dims=DIMS)
        mode = bench.traffic(m, x)
        results[layout] = (mode.calls, mode.moved)
    hand = blockir.compile(program, "LlamaModel", dims=DIMS, seed=0)
    bench.hand_written(hand, mesh, 2)
    mode = bench.traffic(hand, x)
    results["hand"] = (mode.calls, mode.moved)
    lm, dims = bench.build_lm(SimpleNamespace(vocab_size=64, layers=2, kv_heads=2),
                              dict(DIMS, D=64, F=128, H=4))
    ids, target = (torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(i)) for i in (1, 2))
    for name in ("vocab", "vocab hand"):
        m = blockir.compile(lm, "LlamaForCausalLM", dims=dims, seed=0)
        if name == "vocab":
            blockir.parallelize(m, mesh, lm, "LlamaForCausalLM", layout="sequence", dims=dims, vocab=True)
        else:
            bench.hand_written_family(m, mesh, "llama", "sequence")
        mode = bench.lm_traffic(m, ids, target, hand=name != "vocab")
        results[name] = (mode.calls, mode.moved)
    args = SimpleNamespace(layers=2, kv_heads=2, vocab_size=64)
    for family in FAMILIES:
        program, dims = bench.build_family(family, args, dict(DIMS, D=64, F=128, H=4))
        block = bench.FAMILIES[family].block
        one = blockir.compile(program, block, dims=dims, seed=0)
        results[family, "one process"] = torch.nn.functional.cross_entropy(one(ids).reshape(-1, 64), target.reshape(-1))
        for layout in bench.HAND_LAYOUTS:
            for plan in ("derived", "hand"):
                m = blockir.compile(program, block, dims=dims, seed=0)
                if plan == "derived":
                    blockir.parallelize(m, mesh, program, block, layout=layout, dims=dims, vocab=True)
                else:
                    bench.hand_written_family(m, mesh, family, layout)
                mode = bench.lm_traffic(m, ids, target, hand=plan == "hand")
                results[family, layout, plan] = (mode.calls, mode.moved, mode.loss, bench.held_bytes(m))
    return results


@pytest.fixture(scope="module")
def traffic() -> dict[str, Any]:
    return run_world(_body, 2)


def test_sequence_parallel_moves_no_more_than_the_hand_written_plan(traffic: dict[str, Any]) -> None:
    calls, moved = traffic["sequence"]
    hand_calls, hand_moved = traffic["hand"]
    for phase in ("forward", "backward"):
        assert sum(calls[phase].values()) <= sum(hand_calls[phase].values()), phase
        assert sum(moved[phase].values()) <= sum(hand_moved[phase].values()), phase
    # per layer in backward: one reduce-scatter per branch input, one all-gather per branch output (2 layers)
    assert calls["backward"]["reduce_scatter_tensor"] == hand_calls["backward"]["reduce_scatter_tensor"] == 4


def test_a_replicated_stream_reduces_each_branch_input_gradient_once(traffic: dict[str, Any]) -> None:
    calls, moved = traffic["replicated"]
    # forward: the attention and MLP outputs; backward: the attention and MLP inputs (not q, k, v, gate, up)
    assert calls["forward"] == {"all_reduce": 4}
    assert calls["backward"] == {"all_reduce": 4}
    stream = 2 * 8 * 64 * 4  # bytes of one B·S·D fp32 stream
    assert moved["backward"]["all_reduce"] == 4 * stream


def test_a_vocab_parallel_language_model_sends_what_torchtitans_plan_sends(traffic: dict[str, Any]) -> None:
    calls, moved = traffic["vocab"]
    assert (calls, moved) == traffic["vocab hand"]
    stream, rows = 2 * 8 * 64 * 4, 2 * 8 * 4  # bytes of the B·S·D stream and of one value per row, fp32
    # forward: per layer 2 all-gathers and 2 reduce-scatters, the embedding's reduce-scatter, the head's
    # all-gather, the loss's three all-reduces of one value per row; backward mirrors the stream's, loss-free
    assert calls["forward"] == {"all_gather_into_tensor": 5, "reduce_scatter_tensor": 5, "all_reduce": 3}
    assert calls["backward"] == {"all_gather_into_tensor": 5, "reduce_scatter_tensor": 5}
    assert moved["forward"]["all_reduce"] == 3 * rows
    assert moved["forward"]["reduce_scatter_tensor"] == 5 * stream



@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", ("sequence", "replicated"))
def test_a_family_sends_no_more_than_its_hand_written_plan(traffic: dict[str, Any], family: str, layout: str) -> None:
    calls, moved, loss, held = traffic[family, layout, "derived"]
    hand_calls, hand_moved, hand_loss, hand_held = traffic[family, layout, "hand"]
    one = traffic[family, "one process"].item()
    # both plans compute the model: the same next-token loss as one process
    assert loss == pytest.approx(one, rel=1e-5) and hand_loss == pytest.approx(one, rel=1e-5)
    total = lambda c: sum(c["forward"].values()) + sum(c["backward"].values())  # noqa: E731
    assert total(calls) <= total(hand_calls)
    assert total(moved) <= total(hand_moved)
    if family == "phi3":  # the hand-written plan gathers q, k, v of every head; the derived one never does
        assert total(moved) < total(hand_moved)
        assert hand_calls["forward"]["all_gather_into_tensor"] > calls["forward"]["all_gather_into_tensor"]
        # which is what it buys with its qkv_proj split in halves: the derived plan keeps the matrix whole
        # (its q block is twice k's and v's): (64 + 2·32)·64 fp32 values in each of 2 layers against half of them
        assert held - hand_held == 2 * (64 + 2 * 32) * 64 * 4 // 2
    elif family == "olmo2":  # its width norms' gains split with the heads; gathering q and k keeps them whole
        assert held < hand_held
    else:  # a stacked matrix of equal blocks (GPT-2's c_attn, Phi-3's gate_up_proj) stored split, as by hand
        assert held == hand_held


NAMES = {"all-reduce": "all_reduce", "all-gather": "all_gather_into_tensor", "reduce-scatter": "reduce_scatter_tensor"}


def _planned(layout: str) -> dict[str, tuple[Counter, Counter]]:
    """What ``blockir plan`` lists for one forward and backward of the decoder, by CommDebugMode's names:
    calls and operand bytes (fp32; an all-gather's operand is one rank's shard of the payload), the module's own
    boundary included (a sharded stream's result gathered whole). The input needs no gradient here, so the
    first norm computes none and sends none for it (a feature-sharded one still gathers its gain's gradient
    slices), nor does the boundary gather one."""
    import blockir
    from blockir.analyses.parallel import derive_plan
    from blockir.analyses.sizes import Sizes
    program = blockir.load(str(ROOT / "examples" / "llama.block"))
    plan = derive_plan(program, program.block("LlamaModel"), Sizes.of(program, DIMS), layout, 2)
    out = {}
    for phase, listed in (("forward", plan.collectives), ("backward", plan.backward)):
        calls, moved = Counter(), Counter()
        for c in [c for cs in listed.values() for c in cs if phase == "forward" or
                  (c.site != "layers.0.input_layernorm" or c.op == "all-gather") and c.site != ""]:
            calls[NAMES[c.op]] += 1
            moved[NAMES[c.op]] += c.elements * 4 // (2 if c.op == "all-gather" else 1)
        out[phase] = (calls, moved)
    return out


@pytest.mark.parametrize("layout", ("replicated", "sequence", "hidden"))
def test_the_plan_lists_what_comm_debug_mode_counts(traffic: dict[str, Any], layout: str) -> None:
    calls, moved = traffic[layout]
    for phase, (planned_calls, planned_moved) in _planned(layout).items():
        assert (calls[phase], moved[phase]) == (planned_calls, planned_moved), phase
