"""The context layout on two gloo ranks against one process: each rank holds every weight and half the rows,
attention gathers the keys and values of both halves; logits (or outputs) and every gradient must match, and
each layer must issue exactly the plan's gathers forward and reduce-scatters backward. Some cases run again
load-balanced, each rank holding two zig-zag chunks of the rows. One spawned world."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from blockir.api import hf_block_text
from conftest import ROOT
from dist_harness import _run, _run_cases, close, run_world, trains_as_one_process
from hf_configs import CONFIGS, MORE_CONFIGS

FAMILIES = str(ROOT / "tests" / "distributed" / "families.block")
STREAM = {"B": 2, "S": 8, "D": 64}
# model → (program, block, mode, extra): examples and tests' own blocks take a [B, S, D] stream
BLOCKS = {"llama": (str(ROOT / "examples" / "llama.block"), "LlamaModel", "eval"),
          "gpt2-train": (FAMILIES, "GPT2Model", "train"), "gpt2-eval": (FAMILIES, "GPT2Model", "eval"),
          "bert": (FAMILIES, "BertEncoder", "eval"), "heads": (FAMILIES, "HeadParamsModel", "eval")}
# imported causal LMs, token ids in: grouped heads and RoPE (LLaMA, Qwen2 tied), a sliding window of 5 over 8
# positions (Mistral), ALiBi (BLOOM), learned positions and a tied head (GPT-2), trained with HF's default
# dropout (0.1 on the embedding, the residual branches and the attention probabilities, keyed by the global
# query): one training forward and backward, and three SGD steps (``steps``)
DROPOUT = {"attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1}
IMPORTED = {"hf-llama": ("llama", "LlamaForCausalLM", {}, "eval"), "hf-qwen2": ("qwen2", "Qwen2ForCausalLM", {}, "eval"),
            "hf-mistral": ("mistral", "MistralForCausalLM", {}, "eval"),
            "hf-bloom": ("bloom", "BloomForCausalLM", {}, "eval"),
            "hf-gpt2": ("gpt2", "GPT2LMHeadModel", {}, "eval"),
            "hf-gpt2-train": ("gpt2", "GPT2LMHeadModel", DROPOUT, "train"),
            "hf-gpt2-steps": ("gpt2", "GPT2LMHeadModel", DROPOUT, "steps"),
            "hf-llama-dynamic": ("llama-dynamic", "LlamaForCausalLM", {}, "eval"),
            "hf-phi3-longrope": ("phi3-longrope", "Phi3ForCausalLM", {}, "eval")}
# scalings read from the longest position (dynamic NTK, LongRoPE) past an original context of 4: rank 0's own
# rows (positions 0…3) are within it, the call's 8 past it, and every rank rotates by the call's frequencies
# run again load-balanced (parallelize(..., load_balance=True))
BALANCED = ("llama", "gpt2-train", "hf-mistral", "hf-gpt2-steps")


def _kv_cache_refusal(program: str) -> str:
    """What a context-parallel module says when asked to extend a KV cache."""
    import blockir
    from torch.distributed.device_mesh import init_device_mesh
    m = blockir.compile(program, "LlamaModel", dims=STREAM, seed=0)
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),), mesh_dim_names=("cp",))
    blockir.parallelize(m, mesh, program, "LlamaModel", layout="context", dims=STREAM)
    try:
        m(torch.randn(2, 8, 64), past_key_values=blockir.KVCache())
    except blockir.BlockError as exc:
        return str(exc)
    return "no error"


# an extern that reads other rows than its own: under the context layout it gets full rows, which the
# load-balanced stream must hand it in the sequence's order and take back in its own
EXTERN = """dim B: batch
dim S: seq
dim D: model = 16
block E(x: [B, S, D]) -> [B, S, D] {
  n: rmsnorm(D)
  n2: rmsnorm(D)
  attn: self_attention(heads=2, causal=true)
  mix: extern(x: [B, S, D]) -> [B, S, D]
  h = x + attn(n(x))
  y = h + mix(n2(h))
  return y
}
"""


class PrefixSum(torch.nn.Module):
    """Each row's sum with every earlier row of the sequence."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, 1)


def _extern_runs() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The extern block's output and input gradient on one process, context-parallel, and load-balanced."""
    import blockir
    from torch.distributed.device_mesh import init_device_mesh
    program, dims = blockir.parse(EXTERN, "extern.block"), {"B": 2, "S": 8}
    out = {}
    for run in ("one", "context", "balanced"):
        m = blockir.compile(program, "E", dims=dims, seed=0, bind={"mix": PrefixSum()})
        if run != "one":
            mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),), mesh_dim_names=("cp",))
            blockir.parallelize(m, mesh, program, "E", layout="context", dims=dims, load_balance=run == "balanced")
        x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)).requires_grad_()
        y = m(x)
        y.backward(torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2)))
        out[run] = (y.detach(), x.grad)
    return out


def _world(cases: list[tuple[Any, ...]], program: str) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    return _run_cases(cases), _kv_cache_refusal(program), _extern_runs()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, tuple[Any, Any]], str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("context")
    cases = {model: (program, name, STREAM, "context", (2, 8, 64), mode, 1)
             for model, (program, name, mode) in BLOCKS.items()}
    cases["gpt2-fused"] = (FAMILIES, "GPT2Model", STREAM, "context", (2, 8, 64), "train", 1, False, "fused")
    configs = {**CONFIGS, **MORE_CONFIGS}
    for model, (config, name, extra, mode) in IMPORTED.items():
        path = folder / f"{model}.block"
        path.write_text(hf_block_text(dict(configs[config], **extra)))
        cases[model] = (str(path), name, {"B": 2, "S": 8}, "context", (2, 8), mode, 1)
    # load-balanced (zig-zag: rank r holds chunks r and 3 - r of 4): LLaMA, GPT-2 training with dropout and
    # drop_path, imported Mistral (its window over the reordered rows) and GPT-2 taking three SGD steps
    for model in BALANCED:
        cases[f"{model}-balanced"] = (*cases[model][:7], False, "fx", True)
    listed = list(cases.values())
    refs = [_run(program, name, dims, None, shape, mode, 1, *extra)
            for program, name, dims, _, shape, mode, _, *extra in listed]
    pars, refusal, extern = run_world(_world, 2, listed, BLOCKS["llama"][0])
    return dict(zip(cases, zip(refs, pars))), refusal, extern


CASES = [*BLOCKS, "gpt2-fused", *IMPORTED, *(f"{model}-balanced" for model in BALANCED)]


@pytest.mark.parametrize("model", CASES)
def test_context_parallel_matches_one_process(world: tuple[dict, str, dict], model: str) -> None:
    ref, par = world[0][model]
    assert close(par["y"], ref["y"])
    if ref["dx"] is not None:
        assert close(par["dx"], ref["dx"])
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert close(par["grads"][key], g), key
    # every weight whole on every rank (the token and position tables and the head, computed on full tensors,
    # as plain ones); the stream reaches each stack split by rows
    plain = {k for k, v in par["params"].items() if v != "R"}
    assert all(k.endswith(("embed_tokens.weight", "wte.weight", "wpe.weight", "word_embeddings.weight",
                           "lm_head.weight")) for k in plain), plain
    assert any(v == "R" for v in par["params"].values())
    stacks = [k for k in par["inputs"] if k.endswith(("layers", ".h", "transformer.h")) or k in ("h", "layers")]
    assert stacks and all(par["inputs"][k] == "S(1)" for k in stacks)
    assert par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]


def test_each_layer_gathers_its_keys_and_values_and_reduce_scatters_their_gradients(world: tuple[dict, str, dict]) -> None:
    # LLaMA: 2 key/value heads of 16 features over B·S = 16 rows; GPT-2: 4 heads of 16; Mistral: 1 of 16
    for model, elements in (("llama", 512), ("gpt2-train", 1024), ("hf-mistral", 256)):
        _, par = world[0][model]
        layer = next(iter(par["comms"]))
        assert par["comms"][layer] == {("all-gather", elements): 2}
        assert par["comms_backward"][layer] == {("reduce-scatter", elements): 2}


def test_training_really_drops(world: tuple[dict, str, dict]) -> None:
    train, evaluated = world[0]["gpt2-train"][0], world[0]["gpt2-eval"][0]
    assert ((train["y"] - evaluated["y"]).norm() / evaluated["y"].norm()).item() > 1e-2


@pytest.mark.parametrize("model", ["hf-gpt2-steps", "hf-gpt2-steps-balanced"])
def test_attention_dropout_trains_as_one_process(world: tuple[dict, str, dict], model: str) -> None:
    """GPT-2 with its probabilities dropped: each rank keys its queries' decisions by their global index (in
    the zig-zag order too), so three SGD steps give one process's losses and parameters; and the steps really
    dropped and moved."""
    ref, par = world[0][model]
    trains_as_one_process(ref, par)
    # the training forward dropped too: its logits are not the evaluation's
    train, evaluated = world[0]["hf-gpt2-train"][0]["y"], world[0]["hf-gpt2"][0]["y"]
    assert ((train - evaluated).norm() / evaluated.norm()).item() > 1e-2


def test_an_extern_gets_full_rows_in_the_sequences_order(world: tuple[dict, str, dict]) -> None:
    """A bound extern reading every earlier row (a prefix sum) matches one process, load-balanced too."""
    one = world[2]["one"]
    for run in ("context", "balanced"):
        y, dx = world[2][run]
        assert close(y, one[0]) and close(dx, one[1]), run


def test_a_kv_cache_is_refused_at_the_attention(world: tuple[dict, str, dict]) -> None:
    program = BLOCKS["llama"][0]
    assert world[1] == (
        f"{program}:26:3: error[E0633]: self_attention 'self_attn' runs context-parallel: each rank holds a slice "
        "of the sequence's rows, and a KV cache holds the keys of one process's whole sequence\n"
        "  = hint: generate with the module on one process (blockir.compile), or parallelise it with another layout")
