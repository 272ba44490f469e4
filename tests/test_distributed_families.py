"""Imported causal LMs (tiny HF configs, token ids in, logits out) parallelised on real gloo ranks.

The families cover what the importer writes: grouped key/value heads and an untied head with biases (LLaMA),
grouped heads and a tied head (Qwen2), GPT-2's transposed Conv1D weights with q, k, v stacked in one matrix
and a tied head, GPT-NeoX's per-head interleaved q, k, v, Phi-3's stacked q, k, v with grouped heads and
stacked gate/up, OLMo-2's q/k norms over the whole width. Each config drops out whatever its family drops
(attention probabilities, branch updates). Under every layout, at tp=2 and at tp=4, and at four ranks on a
2×2 FSDP2 mesh and an HSDP one: logits and every parameter gradient equal the single-process module, which
equals the HF model it was imported from, and three SGD steps in training mode, dropout on, give one
process's losses and parameters. At tp=2 each stacked layer must also issue exactly the plan's forward
collectives and, counted while its backward runs, exactly the plan's backward ones. The context layout runs
over four ranks (LLaMA, GPT-2) and under FSDP2 on a 2×2 mesh (GPT-2), trained with dropout as the others, and
load-balanced (LLaMA over four ranks, GPT-2 under FSDP2).
LLaMA (untied head) and GPT-2 (tied) also run with the embedding and head split by vocabulary, trained
through ``run``'s loss under ``loss_parallel``. The cases of each world size share one spawned world.
"""
from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch

from blockir.api import hf_block_text as block_text
from dist_harness import compare, data_ranks, output_gradient
from hf_configs import CONFIGS

MODELS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gpt2": "GPT2LMHeadModel",
          "gpt_neox": "GPTNeoXForCausalLM", "phi3": "Phi3ForCausalLM", "olmo2": "Olmo2ForCausalLM"}
# the dropout each family's config can ask for, all of which the importer writes
DROPOUT = {"llama": dict(attention_dropout=0.1), "qwen2": dict(attention_dropout=0.1),
           "gpt2": dict(attn_pdrop=0.1, resid_pdrop=0.1, embd_pdrop=0.0),
           "gpt_neox": dict(attention_dropout=0.1, hidden_dropout=0.1),
           "phi3": dict(attention_dropout=0.1, resid_pdrop=0.1), "olmo2": dict(attention_dropout=0.1)}
# four ranks, one layer: tp=4 replicates 2 key/value heads (LLaMA, Qwen2, Phi-3); OLMo-2's q/k norm over the
# whole key width needs a slice of it on every rank (E0607 otherwise), so it has 4 key/value heads there
WORLD4_CONFIG = {"olmo2": dict(num_key_value_heads=4)}
LAYOUTS = ("replicated", "sequence", "hidden")
CASES = [(model, layout) for model in MODELS for layout in LAYOUTS]
STREAM = {"replicated": "local", "sequence": "S(1)", "hidden": "S(2)", "context": "S(1)"}
# vocab-parallel cases: a vocabulary of 64 splits over two ranks, and the token ids (below 50) hit both halves
VOCAB_MODELS = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}
VOCAB_CASES = [(model, layout, "vocab") for model in VOCAB_MODELS for layout in LAYOUTS]
# (model, layout, dp) on four ranks: the plan over tp=4 in every layout; FSDP2 on a 2×2 (dp, tp) mesh and HSDP
# on (2, 2, 1) or (2, 1, 2), with the layouts taken in turn across the families; and the context layout, its
# sequence of 8 split into 4 slices of 2 rows (LLaMA, GPT-2) or, FSDP2 on a 2×2 mesh, 2 of 4 (GPT-2), and
# load-balanced ("balanced": rank r holds rows r and 7 - r of 8)
HSDP = ((2, 2), (2, 1))
WORLD4 = [(model, layout, 1) for model in MODELS for layout in LAYOUTS] + \
    [(model, LAYOUTS[i % 3], 2) for i, model in enumerate(MODELS)] + \
    [(model, LAYOUTS[(i + 1) % 3], HSDP[i % 2]) for i, model in enumerate(MODELS)] + \
    [("llama", "context", 1), ("gpt2", "context", 1), ("gpt2", "context", 2), ("llama", "context", 1, "balanced"),
     ("gpt2", "context", 2, "balanced")]


def config(model: str, world: int) -> dict[str, Any]:
    """The tiny HF config of a family as the tests of ``world`` ranks import it."""
    cfg = dict(CONFIGS[model], **DROPOUT[model])
    layers = "n_layer" if "n_layer" in cfg else "num_hidden_layers"
    return cfg if world == 2 else dict(cfg, **{layers: 1}, **WORLD4_CONFIG.get(model, {}))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[Any, Any]]:
    folder = tmp_path_factory.mktemp("families")
    files = {}
    for model in MODELS:
        files[model] = folder / f"{model}.block"
        files[model].write_text(block_text(config(model, 2)))
    for model in VOCAB_MODELS:
        files[model, "vocab"] = folder / f"{model}-vocab.block"
        files[model, "vocab"].write_text(block_text(dict(CONFIGS[model], vocab_size=64)))
    cases = [(str(files[model]), MODELS[model], {"B": 2, "S": 8}, layout, (2, 8), "steps", 1) for model, layout in CASES]
    cases += [(str(files[model, "vocab"]), VOCAB_MODELS[model], {"B": 2, "S": 8}, layout, (2, 8), "eval", 1, True)
              for model, layout, _ in VOCAB_CASES]
    return dict(zip(CASES + VOCAB_CASES, compare(cases, world=2)))


@pytest.fixture(scope="module")
def world4(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[Any, ...], tuple[Any, Any]]:
    folder = tmp_path_factory.mktemp("families4")
    for model in MODELS:
        (folder / f"{model}.block").write_text(block_text(config(model, 4)))
    cases = [(str(folder / f"{model}.block"), MODELS[model], {"B": 2 * data_ranks(dp), "S": 8}, layout,
              (2 * data_ranks(dp), 8), "steps", dp, False, "fx", bool(balanced)) for model, layout, dp, *balanced in WORLD4]
    return dict(zip(WORLD4, compare(cases, world=4)))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # 1e-5 relative in fp32; the floor is for gradients that are zero in exact arithmetic (a key bias)
    return (a - b).norm().item() <= 1e-5 * b.norm().item() + 1e-6


@cache
def _hf(model: str, world: int) -> torch.nn.Module:
    """The HF model of the family's config, built once; ``_matches_hf`` loads the one-process module's weights."""
    import transformers
    real = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config(model, world)))
    return real.eval()


def _matches_hf(ref: dict[str, Any], model: str, world: int) -> None:
    """The one-process module equals HF's model with its weights: logits and every gradient, in evaluation."""
    real = _hf(model, world)
    real.zero_grad(set_to_none=True)
    real.load_state_dict(ref["state"], strict=True)
    tokens = torch.randint(0, 50, ref["y"].shape[:2], generator=torch.Generator().manual_seed(1))
    logits = real(tokens).logits
    logits.backward(output_gradient(tuple(logits.shape)))
    assert _close(logits.detach(), ref["y"])
    grads = {k: p.grad for k, p in real.named_parameters()}
    assert set(grads) == set(ref["grads"])
    for key, g in grads.items():
        assert _close(ref["grads"][key], g), key


def _trains_as_one_process(ref: dict[str, Any], par: dict[str, Any]) -> None:
    """Three SGD steps with dropout on: every step's loss and the parameters after the last."""
    assert _close(par["losses"], ref["losses"]), (par["losses"], ref["losses"])
    assert set(par["trained"]) == set(ref["trained"])
    for key, p in ref["trained"].items():
        assert _close(par["trained"][key], p), key
    # the steps really dropped (the first one's loss is not the evaluation's) and really moved the weights
    assert abs(ref["losses"][0] - ref["eval_loss"]) > 1e-2 * abs(ref["eval_loss"])
    assert abs(ref["losses"][2] - ref["losses"][0]) > 1e-1 * abs(ref["losses"][0])


def _matches(ref: dict[str, Any], par: dict[str, Any]) -> None:
    assert _close(par["y"], ref["y"])
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert _close(par["grads"][key], g), key
    _trains_as_one_process(ref, par)


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_an_imported_family_matches_one_process_and_hf(world: dict, case: tuple[str, str]) -> None:
    ref, par = world[case]
    _matches(ref, par)
    _matches_hf(ref, case[0], 2)
    assert par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]
    layers = next(k for k in par["inputs"] if k.endswith("layers") or k.endswith(".h"))
    assert par["inputs"][layers] == STREAM[case[1]]


@pytest.mark.parametrize("case", WORLD4, ids=lambda c: "-".join(map(str, c)))
def test_an_imported_family_over_four_ranks_matches_one_process_and_hf(world4: dict, case: tuple[Any, ...]) -> None:
    """tp=4 (the key/value heads replicated where there are 2), FSDP2 over dp=2 with tp=2, HSDP, and the
    context layout (every weight replicated) over 4 ranks and under FSDP2."""
    ref, par = world4[case]
    _matches(ref, par)
    _matches_hf(ref, case[0], 4)
    params, dp = par["params"], case[2]
    q = next(k for k in params if k.endswith(("q_proj.weight", "c_attn.weight", "qkv_proj.weight",
                                                 "query_key_value.weight")))
    if dp == 1:
        assert par["comms"] == par["planned"]
        layers = next(k for k in par["inputs"] if k.endswith("layers") or k.endswith(".h"))
        assert par["inputs"][layers] == STREAM[case[1]]
        assert params[q] == ("R" if case[0] in ("gpt2", "phi3") or case[1] == "context" else "S(0)")
    else:  # FSDP2 shards every parameter over dp (HSDP: replicated over dp_replicate first)
        lead = ("S(0)", "_S(0,") if dp == 2 else ("R,S(0)", "R,_S(0,")
        assert all(p.startswith(lead) for p in params.values()), params


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
