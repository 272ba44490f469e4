"""Imported causal LMs (tiny HF configs, token ids in, logits out) parallelised on real gloo ranks.

The families cover what the importer writes: grouped key/value heads and an untied head with biases (LLaMA), grouped
heads and a tied head (Qwen2), GPT-2's transposed Conv1D weights with q, k, v stacked in one matrix and a tied head,
GPT-NeoX's per-head interleaved q, k, v, Phi-3's stacked q, k, v with grouped heads and stacked gate/up, OLMo-2's
q/k norms over the whole width (at tp=4 the key norm's over its 2 replicated key/value heads), CodeGen's q, v, k in
4 row groups (whole groups per rank at 2 and 4 ranks) with a partial interleaved rotary. Each config drops out
whatever its family drops (attention probabilities, branch updates). Under every layout, at tp=2 and at tp=4, and at
four ranks on a 2×2 FSDP2 mesh and an HSDP one: logits and every parameter gradient equal the single-process module,
which equals the HF model it was imported from, and three SGD steps in training mode, dropout on, give one process's
losses and parameters. At tp=2 and tp=4 each stacked layer must also issue exactly the plan's forward collectives
and, counted while its backward runs, exactly the plan's backward ones. LLaMA (untied head) and GPT-2 (tied) also
run with the embedding and head split by vocabulary, trained through ``run``'s loss under ``loss_parallel``. Mixtral
and Qwen2-MoE (a gated shared expert), split by hidden units inside every expert, run as the others over two ranks
and at tp=4, and at four ranks under FSDP2 and HSDP, and whole under the context layout (over two and four ranks,
Qwen2-MoE under FSDP2 and Mixtral under HSDP), compared with one process and HF alike. The context layout runs over four ranks (LLaMA, GPT-2), under FSDP2 on a 2×2 mesh
(GPT-2) and under HSDP on (2, 1, 2) (GPT-2), trained with dropout as the others, and load-balanced (LLaMA over four ranks, GPT-2 under
FSDP2). Every other config the importer is tested with (the encoders among them, fed all-zero token types) runs one
layer deep under every layout, the context one included, over two ranks and over four, three training steps each,
each layer's collectives counted against the plan, and three steps on a data-parallel mesh of four ranks (FSDP2 or
HSDP in turn). The two-rank cases share one world and the four-rank ones two, their ranks forked from a server that
has imported torch and blockir once.
"""
from __future__ import annotations

import hashlib
from functools import cache
from typing import Any

import pytest
import torch

import blockir
from blockir.api import hf_block_text as block_text
from blockir.analyses.summaries import called_blocks
from dist_harness import (Comparison, close, compare, data_ranks, output_gradient, start_alongside,
                          trains_as_one_process)
from hf_configs import CONFIGS, MORE_CONFIGS

MODELS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gpt2": "GPT2LMHeadModel",
          "gpt_neox": "GPTNeoXForCausalLM", "phi3": "Phi3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
          "codegen": "CodeGenForCausalLM"}
# the dropout each family's config can ask for, all of which the importer writes
DROPOUT = {"llama": dict(attention_dropout=0.1), "qwen2": dict(attention_dropout=0.1),
           "gpt2": dict(attn_pdrop=0.1, resid_pdrop=0.1, embd_pdrop=0.0),
           "gpt_neox": dict(attention_dropout=0.1, hidden_dropout=0.1),
           "phi3": dict(attention_dropout=0.1, resid_pdrop=0.1), "olmo2": dict(attention_dropout=0.1),
           "mixtral": dict(attention_dropout=0.1), "qwen2_moe": dict(attention_dropout=0.1),
           "codegen": dict(attn_pdrop=0.1, resid_pdrop=0.1, embd_pdrop=0.0),
           "opt-post-ln": dict(dropout=0.1, attention_dropout=0.1), "biogpt": dict(attention_probs_dropout_prob=0.1)}
# linears outside a branch under hidden sharding, trained: OPT's narrower embedding projected in and out
# (row-parallel, each reducing onto the stream's shards) and BioGPT's fc1/fc2 with an activation dropout between
PROJECTED = {"opt-post-ln": "OPTForCausalLM", "biogpt": "BioGptForCausalLM"}
PROJECTED_CASES = [(model, layout, "projected") for model in PROJECTED for layout in ("hidden", "context")]
# four ranks, one layer: tp=4 replicates 2 key/value heads (LLaMA, Qwen2, Phi-3, OLMo-2, whose key norm over the
# whole key width then takes its moments from the ranks' partial sums over the heads they compute)
LAYOUTS = ("replicated", "sequence", "hidden")
STREAM = {"replicated": "local", "sequence": "S(1)", "hidden": "S(2)", "context": "S(1)"}
# vocab-parallel cases: a vocabulary of 64 splits over two ranks, and the token ids (below 50) hit both halves
VOCAB_MODELS = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}
VOCAB_CASES = [(model, layout, "vocab") for model in VOCAB_MODELS for layout in (*LAYOUTS, "context")]
# (model, layout, dp) on four ranks: the plan over tp=4 in every layout; FSDP2 on a 2×2 (dp, tp) mesh and HSDP
# on (2, 2, 1) or (2, 1, 2), with the layouts taken in turn across the families
# and the context layout, its sequence of 8 split into 4 slices of 2 rows (LLaMA, GPT-2) or, FSDP2 on a 2×2
# mesh, 2 of 4 (GPT-2), and load-balanced ("balanced": rank r holds rows r and 7 - r of 8)
HSDP = ((2, 2), (2, 1))
WORLD4 = [(model, layout, 1) for model in MODELS for layout in LAYOUTS] + \
    [(model, LAYOUTS[i % 3], 2) for i, model in enumerate(MODELS)] + \
    [(model, LAYOUTS[(i + 1) % 3], HSDP[i % 2]) for i, model in enumerate(MODELS)] + \
    [("llama", "context", 1), ("gpt2", "context", 1), ("gpt2", "context", 2), ("llama", "context", 1, "balanced"),
     ("gpt2", "context", 2, "balanced")]
# mixtures of experts under FSDP2 and HSDP (tensor parallelism inside the experts, whose stacked [E, ...] tensors
# FSDP2 shards by expert): Qwen2-MoE's gated shared expert on a (2, 1, 2) mesh, with tp=2 inside every expert
MOE_MODELS = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}
WORLD4 += [("mixtral", "sequence", 2), ("qwen2_moe", "hidden", 2), ("mixtral", "hidden", (2, 2)),
           ("qwen2_moe", "sequence", (2, 1))]
# and under the context layout, every expert whole on every rank routing its own rows: over four ranks, and
# Qwen2-MoE under FSDP2 on a 2×2 ("dp", "cp") mesh
WORLD4 += [("mixtral", "context", 1), ("qwen2_moe", "context", 1), ("qwen2_moe", "context", 2)]
# HSDP over a context-parallel axis: two replicas of two ranks' slices of the sequence, dense and MoE
WORLD4 += [("gpt2", "context", (2, 1)), ("mixtral", "context", (2, 1))]
# and the mixtures of experts under each tensor-parallel layout at tp=4
WORLD4 += [(model, layout, 1) for model in MOE_MODELS for layout in LAYOUTS]
ARCHITECTURES = MODELS | MOE_MODELS
# over two ranks the mixtures of experts too, each of them under every layout
CASES = [(model, layout) for model in ARCHITECTURES for layout in (*LAYOUTS, "context")]
# every other config the importer is tested with, one layer deep, under every layout over two ranks and over four,
# trained for three SGD steps with dropout on (whichever of these keys the family reads, on attention probabilities
# and branch updates): logits and every gradient of the first equal one process, whose module equals HF's in
# evaluation, each layer sends exactly the plan's collectives, forward and backward, and the losses and parameters
# of the three equal one process's
BREADTH = sorted(set(CONFIGS | MORE_CONFIGS) - set(ARCHITECTURES) - set(PROJECTED))
BREADTH_DROPOUT = dict(attention_dropout=0.1, attn_pdrop=0.1, resid_pdrop=0.1, resid_dropout=0.1, hidden_dropout=0.1,
                       hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, dropout=0.1)
UNDROPPED = {"ernie4_5"}  # its HF layer has no dropout to ask for: training equals evaluation
BREADTH_CASES = [(model, layout, 2) for model in BREADTH for layout in (*LAYOUTS, "context")]
BREADTH4 = [(model, layout, 4) for model in BREADTH for layout in (*LAYOUTS, "context")]
# and in the same four-rank world each on a data-parallel mesh, in turn FSDP2 on 2×2 and HSDP on (2, 2, 1) or
# (2, 1, 2), under a layout taken in turn (each four consecutive configs take all four, the meshes shifting)
BREADTH_DP = [(model, (*LAYOUTS, "context")[(i + i // 4) % 4], "dp", HSDP[i // 2 % 2] if i % 2 else 2)
              for i, model in enumerate(BREADTH)]
# a layer's heads split over four ranks: BLOOM's six would not (refused with E0730); GPT-Neo's
# one layer is the local (windowed) attention of its global/local pair
SPLITTABLE = {"bloom": dict(n_head=4), "gpt_neo": dict(attention_types=[[["local"], 1]])}
LAYER_COUNTS = ("n_layer", "n_layers", "num_layers", "num_hidden_layers")
# an encoder's top block is the HF base model, compared on its last hidden state (BERT-style ones without the
# pooler, which the import does not write)
POOLED = {"bert", "roberta", "camembert", "xlm-roberta"}
ENCODER_TOPS = {"bert": "BertModel", "roberta": "RobertaModel", "camembert": "CamembertModel",
                "xlm-roberta": "XLMRobertaModel", "electra": "ElectraModel", "distilbert": "DistilBertModel"}


def config(model: str, world: int) -> dict[str, Any]:
    """The tiny HF config of a family as the tests of ``world`` ranks import it: the breadth set's always one layer
    deep, the others at four ranks."""
    deep = model in ARCHITECTURES or model in PROJECTED
    dropout = DROPOUT[model] if deep else BREADTH_DROPOUT
    cfg = dict((CONFIGS | MORE_CONFIGS)[model], **dropout, **SPLITTABLE.get(model, {}))
    return cfg if world == 2 and deep else dict(cfg, **{k: 1 for k in LAYER_COUNTS if k in cfg})


@pytest.fixture(scope="module")
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[tuple[str, str], tuple[Any, Any]]:
    start_alongside(request, "started4", "world4")  # the four-rank world runs alongside this one
    folder = tmp_path_factory.mktemp("families")
    files = {}
    for model in ARCHITECTURES:
        files[model] = folder / f"{model}.block"
        files[model].write_text(block_text(config(model, 2)))
    for model in VOCAB_MODELS:
        files[model, "vocab"] = folder / f"{model}-vocab.block"
        files[model, "vocab"].write_text(block_text(dict(CONFIGS[model], vocab_size=64)))
    cases = [(str(files[model]), ARCHITECTURES[model], {"B": 2, "S": 8}, layout, (2, 8), "steps", 1)
             for model, layout in CASES]
    cases += [(str(files[model, "vocab"]), VOCAB_MODELS[model], {"B": 2, "S": 8}, layout, (2, 8), "eval", 1, True)
              for model, layout, _ in VOCAB_CASES]
    for model, layout, _ in PROJECTED_CASES:
        path = folder / f"{model}.block"
        path.write_text(block_text(config(model, 2)))
        cases.append((str(path), PROJECTED[model], {"B": 2, "S": 8}, layout, (2, 8), "steps", 1))
    cases += _breadth(folder, BREADTH_CASES)
    return dict(zip(CASES + VOCAB_CASES + PROJECTED_CASES + BREADTH_CASES, compare(cases, world=2)))


def _breadth(folder: Any, cases: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The harness's cases of the breadth set: each config's one-layer import under its layout, trained (three
    steps or one pass), on a data-parallel mesh where the case names one (its last entry after "dp")."""
    out = []
    for model, layout, *tag in cases:
        dp = tag[-1] if tag[0] == "dp" else 1
        path = folder / f"{model}-breadth.block"
        text, top = _breadth_import(model)
        path.write_text(text)
        batch = 2 * data_ranks(dp)
        # every rank compiles the same weights (seed 0): each keeps its own, with no broadcast
        out.append((str(path), top, {"B": batch, "S": 8}, layout, (batch, 8), "steps", dp, False, "fx", False, None))
    return out


@cache
def _breadth_import(model: str) -> tuple[str, str]:
    """A breadth config's one-layer import and its model block's name (the one no other block instantiates)."""
    text = block_text(config(model, 4))
    program = blockir.parse(text, "<import>")
    return text, [b.name for b in program.blocks if b.name not in called_blocks(program)][-1]


@pytest.fixture(scope="module")
def world4(started4: tuple[list[Any], list[Comparison]]) -> dict[tuple[Any, ...], tuple[Any, Any]]:
    keys, comparisons = started4
    return dict(zip(keys, [pair for comparison in comparisons for pair in comparison.result()]))


@pytest.fixture(scope="module")
def started4(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], list[Comparison]]:
    folder = tmp_path_factory.mktemp("families4")
    for model in ARCHITECTURES:
        (folder / f"{model}.block").write_text(block_text(config(model, 4)))
    cases = [(str(folder / f"{model}.block"), ARCHITECTURES[model], {"B": 2 * data_ranks(dp), "S": 8}, layout,
              (2 * data_ranks(dp), 8), "steps", dp, False, "fx", bool(balanced)) for model, layout, dp, *balanced in WORLD4]
    cases += _breadth(folder, BREADTH4 + BREADTH_DP)
    # in two worlds of four ranks, every other case each: when the two-rank world is done they still keep both
    # cores busy, where one world's ranks would wait on each other's collectives a sixth of the time
    keys = WORLD4 + BREADTH4 + BREADTH_DP
    return keys[::2] + keys[1::2], [Comparison(cases[::2], world=4), Comparison(cases[1::2], world=4)]


def _digest(state: dict[str, torch.Tensor]) -> str:
    return hashlib.sha1(b"".join(k.encode() + v.numpy().tobytes() for k, v in state.items())).hexdigest()


_PASSES: dict[tuple[Any, ...], tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}


def _hf_pass(model: str, world: int, shape: tuple[int, ...], digest: str, state: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """HF's logits and parameter gradients with ``state`` loaded, on the tests' token ids: once per config and
    weights (``digest``), as every layout and world of a breadth config compares the same one-process module."""
    key = (model, world, shape, digest)
    if key not in _PASSES:
        real = _hf(model, world)
        real.zero_grad(set_to_none=True)
        real.load_state_dict(state, strict=True)
        tokens = torch.randint(0, 50, shape, generator=torch.Generator().manual_seed(1))
        logits = real(tokens)[0]  # a causal LM's logits, an encoder's last hidden state (its token types all 0)
        logits.backward(output_gradient(tuple(logits.shape)))
        _PASSES[key] = logits.detach(), {k: p.grad.clone() for k, p in real.named_parameters()}
    return _PASSES[key]


@cache
def _hf(model: str, world: int) -> torch.nn.Module:
    """The HF model of the family's config, built once; ``_matches_hf`` loads the one-process module's weights."""
    import transformers
    cfg = transformers.AutoConfig.for_model(**config(model, world))
    if model not in ENCODER_TOPS:
        return transformers.AutoModelForCausalLM.from_config(cfg).eval()
    pooler = {"add_pooling_layer": False} if model in POOLED else {}
    return getattr(transformers, ENCODER_TOPS[model])(cfg, **pooler).eval()


def _matches_hf(ref: dict[str, Any], model: str, world: int) -> None:
    """The one-process module equals HF's model with its weights: logits and every gradient, in evaluation."""
    ref = dict(ref, **(ref["evaluation"] or {}))  # a training case's evaluation pass; an evaluation case is one
    logits, grads = _hf_pass(model, world, tuple(ref["y"].shape[:2]), _digest(ref["state"]), ref["state"])
    assert close(logits, ref["y"])
    assert set(grads) == set(ref["grads"])
    for key, g in grads.items():
        assert close(ref["grads"][key], g), key


def _matches(ref: dict[str, Any], par: dict[str, Any], dropped: bool = True, trained: bool = True) -> None:
    assert close(par["y"], ref["y"])
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert close(par["grads"][key], g), key
    if trained:
        trains_as_one_process(ref, par, dropped)


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_an_imported_family_matches_one_process_and_hf(world: dict, case: tuple[str, str]) -> None:
    ref, par = world[case]
    _matches(ref, par)
    _matches_hf(ref, case[0], 2)
    assert par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]
    layers = next(k for k in par["inputs"] if k.endswith("layers") or k.endswith(".h"))
    assert par["inputs"][layers] == STREAM[case[1]]


@pytest.mark.parametrize("case", PROJECTED_CASES, ids="-".join)
def test_linears_outside_a_branch_split_by_rows_under_hidden_sharding(world: dict, case: tuple[str, str, str]) -> None:
    """Logits, every gradient and three training steps with dropout equal one process and HF, and the whole step,
    the model's boundary and the projections included, sends exactly the plan's collectives; under the context
    layout every linear is whole on every rank."""
    ref, par = world[case]
    _matches(ref, par)
    _matches_hf(ref, case[0], 2)
    assert par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]
    params = par["params"]
    if case[1] == "context":  # each rank applies every linear whole to its rows
        assert set(params.values()) <= {"R", "local"}, params
    elif case[0] == "opt-post-ln":  # 64 → 32 → 64 features: each rank holds its input columns of the weight
        assert params["model.decoder.project_in.weight"] == params["model.decoder.project_out.weight"] == "S(1)"
    else:  # the pair splits as an MLP does, its activation dropout drawn on each rank's global hidden units
        assert params["biogpt.layers.0.fc1.weight"] == "S(0)" and params["biogpt.layers.0.fc2.weight"] == "S(1)"


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
        assert par["comms_backward"] == par["planned_backward"]
        if case[0] == "olmo2":  # the key norm over the 2 replicated key/value heads keeps its gain whole
            assert params["model.layers.0.self_attn.k_norm.weight"] == "R"
            assert params["model.layers.0.self_attn.q_norm.weight"] == "S(0)"
        layers = next(k for k in par["inputs"] if k.endswith("layers") or k.endswith(".h"))
        assert par["inputs"][layers] == STREAM[case[1]]
        # GPT-2's stacked q, k, v (4 heads each) split within each block; Phi-3's, with 2 key/value heads replicated
        # over the 4 ranks, read from a whole matrix
        split = {"gpt2": "_S(1, 3)", "phi3": "R"}.get(case[0], "S(0)")
        assert params[q] == ("R" if case[1] == "context" else split)
    else:
        _sharded_over_data(params, dp)
        if dp == 2 and case[0] in ("gpt2", "phi3") and case[1] != "context":  # stacked: split within blocks over tp
            assert {k: v for k, v in params.items() if k.endswith(("c_attn.weight", "c_attn.bias", "gate_up_proj.weight"))} \
                == STACKED_UNDER_FSDP2[case[0]]


# under FSDP2 a weight stacked along dim 0 and split within its blocks over tp is sharded along dim 1 over dp, and a
# bias of several blocks is replicated over tp: FSDP2 composes its shard of a dim with a strided one of the same dim
# as if that were a plain shard (torch 2.13)
STACKED_UNDER_FSDP2 = {
    "gpt2": {f"transformer.h.0.attn.c_attn.{k}": v for k, v in (("weight", "S(0),_S(1, 3)"), ("bias", "S(0),R"))},
    "phi3": {"model.layers.0.mlp.gate_up_proj.weight": "S(1),_S(0, 2)"}}


def _sharded_over_data(params: dict[str, str], dp: Any) -> None:
    """FSDP2 shards every parameter over dp (HSDP: replicated over dp_replicate first), along dim 0 but where the
    tensor-parallel placement is a strided shard of dim 0."""
    lead = "" if dp == 2 else "R,"
    for key, p in params.items():
        assert p.startswith((f"{lead}S(0)", f"{lead}_S(0,", f"{lead}S(1),_S(0,")), (key, p)


@pytest.mark.parametrize("case", BREADTH_CASES + BREADTH4, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_every_imported_config_matches_one_process_and_hf(request: pytest.FixtureRequest,
                                                          case: tuple[str, str, int]) -> None:
    ref, par = request.getfixturevalue("world" if case[2] == 2 else "world4")[case]
    _matches(ref, par, dropped=case[0] not in UNDROPPED)
    _matches_hf(ref, case[0], 4)
    assert par["planned"] and par["comms"] == par["planned"]
    assert par["comms_backward"] == par["planned_backward"]
    if case[1] == "context":  # every weight whole on every rank: replicated, or a plain table
        assert set(par["params"].values()) <= {"R", "local"}, {k: v for k, v in par["params"].items() if v not in ("R", "local")}


@pytest.mark.parametrize("case", BREADTH_DP, ids=lambda c: f"{c[0]}-{c[1]}-dp{c[3]}")
def test_every_imported_config_trains_under_fsdp2_or_hsdp(world4: dict, case: tuple[Any, ...]) -> None:
    """FSDP2 over dp with tp=2, or HSDP: logits and every gradient equal one process and HF, three training steps
    with dropout equal one process's, and every parameter is sharded over the data axes (replicated first)."""
    ref, par = world4[case]
    _matches(ref, par, dropped=case[0] not in UNDROPPED)
    _matches_hf(ref, case[0], 4)
    _sharded_over_data(par["params"], case[3])


def test_a_post_ln_norm_inside_a_branchs_module_is_replicated_under_hidden_sharding(world4: dict) -> None:
    """BERT's attention module holds its Post-LN norm (``attention.output.LayerNorm``): the branch's input style
    places no parameter, so the norm's gain and shift become replicated DTensors that meet the sharded stream."""
    params = world4[("bert", "hidden", 4)][1]["params"]
    assert params["encoder.layer.0.attention.output.LayerNorm.weight"] == "R"
    assert params["encoder.layer.0.attention.output.LayerNorm.bias"] == "R"
    assert params["encoder.layer.0.attention.self.query.weight"] == "S(0)"


def _placements(world: dict, model: str, layout: str = "sequence") -> dict[str, str]:
    return world[(model, layout)][1]["params"]


def test_a_tied_head_keeps_one_table_computed_on_full_rows(world: dict) -> None:
    for model in ("qwen2", "gpt2"):
        params = _placements(world, model)
        embedding = next(k for k in params if k.endswith(("embed_tokens.weight", "wte.weight")))
        assert params[embedding] == "local"
        assert not any(k.startswith("lm_head") for k in params)  # the head's weight is the embedding's


def test_fused_matrices_are_split_by_their_head_groups(world: dict) -> None:
    gpt2, neox, phi3, codegen = (_placements(world, m) for m in ("gpt2", "gpt_neox", "phi3", "codegen"))
    # GPT-2's Conv1D stores [in, out]: the MLP's columns are dim 1, the output projection's rows dim 0
    assert gpt2["transformer.h.0.mlp.c_fc.weight"] == "S(1)" and gpt2["transformer.h.0.mlp.c_fc.bias"] == "S(0)"
    assert gpt2["transformer.h.0.mlp.c_proj.weight"] == gpt2["transformer.h.0.attn.c_proj.weight"] == "S(0)"
    # a stacked q/k/v of equal blocks (or gate/up) is stored split within each block: a rank's columns are its
    # slice of each; Phi-3's q, k, v with grouped key/value heads are blocks of different sizes: the matrix stays whole
    assert gpt2["transformer.h.0.attn.c_attn.weight"] == "_S(1, 3)"
    assert gpt2["transformer.h.0.attn.c_attn.bias"] == "_S(0, 3)"
    assert phi3["model.layers.0.self_attn.qkv_proj.weight"] == "R"
    assert phi3["model.layers.0.mlp.gate_up_proj.weight"] == "_S(0, 2)"
    # per head q, k, v in turn: a rank's heads are one contiguous block
    assert neox["gpt_neox.layers.0.attention.query_key_value.weight"] == "S(0)"
    # q/v/k in 4 row groups over 2 ranks: a rank's heads are 2 whole groups, one contiguous block
    assert codegen["transformer.h.0.attn.qkv_proj.weight"] == "S(0)"


def test_a_q_k_norm_over_the_whole_width_is_split_with_the_heads(world: dict) -> None:
    params = _placements(world, "olmo2")
    assert params["model.layers.0.self_attn.q_norm.weight"] == params["model.layers.1.self_attn.k_norm.weight"] == "S(0)"
    planned = world[("olmo2", "replicated")][1]["planned"]["model.layers.0"]
    # the row moments of q and of k: one all-reduce of Σx² per row each (B·S = 16), beside the stream's two
    assert planned[("all-reduce", 16)] == 2 and planned[("all-reduce", 2 * 8 * 64)] == 2


# the embedding's pending sum reduced onto the stream, the head's input gathered to full rows; B·S·D = 2·8·64
TABLES = {"replicated": ([("all-reduce", 1024)], []),
          "sequence": ([("reduce-scatter", 1024)], [("all-gather", 1024)]),
          "context": ([("reduce-scatter", 1024)], [("all-gather", 1024)]),
          "hidden": ([("reduce-scatter", 1024)], [("all-gather", 1024)])}


@pytest.mark.parametrize("case", VOCAB_CASES, ids="-".join)
def test_a_vocab_parallel_modeltrains_as_one_process(world: dict, case: tuple[str, str, str]) -> None:
    ref, par = world[case]
    assert close(par["y"], ref["y"])
    assert abs(par["loss"].item() - ref["loss"].item()) <= 1e-5 * ref["loss"].item()
    assert set(par["grads"]) == set(ref["grads"])
    for key, g in ref["grads"].items():
        assert close(par["grads"][key], g), key
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
# reduced once, each reduce-scatter's gradient gathered; a feature-sharded norm's own path all-reduces its
# backward's row sums (RMSNorm Σg·x̂, LayerNorm Σg and Σg·x̂) and gathers the gradient slices of each replicated
# gain and shift (64 features); OLMo-2's q/k norms over the width (64 and 32 features) have their gains stored
# split with the heads, so they send their row sums only; CodeGen's one LayerNorm feeds both branches (GPT-J's parallel
# residual), each branch input reduced once
BACKWARD = {("qwen2", "replicated"): {("all-reduce", 1024): 2},
            ("qwen2", "sequence"): {("all-gather", 1024): 2, ("reduce-scatter", 1024): 2},
            ("qwen2", "hidden"): {("all-gather", 1024): 2, ("reduce-scatter", 1024): 2, ("all-gather", 64): 2,
                                  ("all-reduce", 16): 2},
            ("gpt2", "hidden"): {("all-gather", 1024): 2, ("reduce-scatter", 1024): 2, ("all-gather", 64): 4,
                                 ("all-reduce", 32): 2},
            ("olmo2", "replicated"): {("all-reduce", 1024): 2, ("all-reduce", 16): 2},
            ("olmo2", "hidden"): {("all-gather", 1024): 2, ("reduce-scatter", 1024): 2, ("all-gather", 64): 2,
                                  ("all-reduce", 16): 4},
            ("codegen", "hidden"): {("all-gather", 1024): 2, ("reduce-scatter", 1024): 2, ("all-gather", 64): 2,
                                    ("all-reduce", 32): 1}}


@pytest.mark.parametrize("case", BACKWARD, ids="-".join)
def test_a_layers_backward_sends_the_duals_of_its_forward(world: dict, case: tuple[str, str]) -> None:
    layer = next(iter(world[case][1]["comms_backward"]))
    assert world[case][1]["comms_backward"][layer] == BACKWARD[case]


def test_fsdp2_shards_the_stacked_experts_by_expert_over_their_tensor_parallel_split(world4: dict) -> None:
    """FSDP2 shards each [E, ...] expert tensor along its experts over dp, on top of its tp placement (the
    gate/up rows the rank's slice of each block, the down columns split by hidden units); HSDP replicates first."""
    mlp = "model.layers.0.mlp."
    for case, lead in ((("qwen2_moe", "hidden", 2), "S(0)"), (("qwen2_moe", "sequence", (2, 1)), "R,S(0)")):
        params = world4[case][1]["params"]
        assert params[mlp + "experts.gate_up_proj"] == f"{lead},_S(1, 2)"
        assert params[mlp + "gate.weight"] == f"{lead},R"
        assert params[mlp + "experts.down_proj"] == f"{lead},S(2)"
        assert params[mlp + "shared_expert_gate.weight"] == f"{lead},R"


def test_a_mixture_of_experts_under_the_context_layout_routes_each_ranks_rows_through_whole_experts(world4: dict) -> None:
    """Every expert, the router and the shared expert replicated; a layer sends only its attention's key and value
    gathers (B·S·kv_heads·head_dim = 2·8·2·8 each), as the experts read each row alone."""
    for model in ("mixtral", "qwen2_moe"):
        par = world4[(model, "context", 1)][1]
        mlp = {k: v for k, v in par["params"].items() if ".mlp." in k}
        assert mlp and set(mlp.values()) == {"R"}, mlp
        assert par["planned"]["model.layers.0"] == {("all-gather", 2 * 8 * 2 * 8): 2}


def test_the_tokens_reach_several_experts_and_every_moe_weight_learns(world: dict) -> None:
    """The mixtures of experts' comparisons are not vacuous: each layer routes rows to more than one expert, and
    the router's, the experts' and the shared expert's gradients are nonzero."""
    ref, _ = world["qwen2_moe", "sequence"]
    for i in range(2):
        mlp = f"model.layers.{i}.mlp."
        down = ref["grads"][mlp + "experts.down_proj"]
        assert (down.flatten(1).norm(dim=1) > 0).sum() >= 2
        for key in ("gate.weight", "experts.gate_up_proj", "shared_expert.up_proj.weight", "shared_expert_gate.weight"):
            assert ref["grads"][mlp + key].norm() > 0, key


def test_experts_are_split_by_hidden_units_and_the_router_replicated(world: dict) -> None:
    params = world["qwen2_moe", "hidden"][1]["params"]
    mlp = "model.layers.0.mlp."
    assert {k[len(mlp):]: v for k, v in params.items() if k.startswith(mlp)} == {
        "gate.weight": "R", "experts.gate_up_proj": "_S(1, 2)", "experts.down_proj": "S(2)",
        "shared_expert.gate_proj.weight": "S(0)", "shared_expert.up_proj.weight": "S(0)",
        "shared_expert.down_proj.weight": "S(1)", "shared_expert_gate.weight": "R"}
