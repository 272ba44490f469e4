"""The manifest's training, tensor and runtime fields, each checked against what the compiled module and the
trainer do: dropout owners, initialisation gains, padding policy, the embedding norm, the recipe contract and
the run-time facts."""
from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout

import torch

import blockir
from blockir.analyses.manifest import program_manifest
from blockir.analyses.recipe_contract import FIELDS
from blockir.lower import runtime_facts
from blockir.cli import main
from blockir.reports.run_manifest import run_manifest
from conftest import ROOT

LAB = ROOT / "tests" / "failure_lab"


def _blocks(name: str) -> dict:
    return program_manifest(blockir.load(ROOT / "examples" / f"{name}.block"))["blocks"]


def test_every_dropout_owner_of_bug_21_is_listed() -> None:
    program = blockir.load(LAB / "21_attention_dropout_as_residual.block")
    owners = program_manifest(program)["blocks"]["OneSetting"]["dropout_owners"]
    assert owners == [
        {"owner": "attn", "kind": "attention_probabilities", "p": 0.1,
         "acts_on": "the attention probabilities inside 'attn' (per head, query and key row)",
         "rng": "torch_generator"},
        {"owner": "%4", "kind": "residual", "p": 0.1, "acts_on": "the update of 'mlp' before the residual add",
         "rng": "keyed", "mask": "element", "branch": "mlp"}]


def test_drop_path_inner_and_extern_owners() -> None:
    ls = _blocks("layerscale")["LayerScaleBlock"]["dropout_owners"]
    assert [(o["kind"], o["p"], o.get("mask"), o.get("branch")) for o in ls] == [
        ("attention_probabilities", 0.0, None, None), ("drop_path", 0.1, "sample", "attn"),
        ("drop_path", 0.1, "sample", "mlp")]
    gpt2 = _blocks("gpt2")["GPT2Block"]["dropout_owners"]
    assert [(o["owner"], o["kind"], o["p"], o["rng"]) for o in gpt2] == [
        ("attn", "extern", None, "bound_module"), ("mlp", "extern", None, "bound_module")]


def test_initialisation_gains_are_the_ones_compile_applies() -> None:
    deep = _blocks("deepnorm")["DeepNormLayer"]["initialisation"]
    beta = (8 * 24) ** -0.25
    assert deep == [{"decl": "self_attn", "kind": "self_attention", "init_gain": beta, "gain_on": ["v", "o"],
                     "unit_gain_on": ["q", "k"]},
                    {"decl": "mlp", "kind": "mlp", "init_gain": beta, "gain_on": ["fc1", "fc2"], "unit_gain_on": []}]
    assert _blocks("rezero")["ReZeroLayer"]["initialisation"] == [{"decl": "resweight", "kind": "scalar", "init": 0}]
    fixup = blockir.load(ROOT / "examples" / "fixup.block")
    entries = {e["decl"]: e for b in program_manifest(fixup)["blocks"].values() for e in b.get("initialisation", [])}
    zeroed = [e for e in entries.values() if e.get("init_zero")]
    assert zeroed and all(e["zero_on"] in ("o", "fc2", "down") for e in zeroed)
    # the module factory applies what the manifest states: zeroed last layers, Xavier std × β on gained ones
    m = blockir.compile(ROOT / "examples" / "deepnorm.block", "DeepNormDecoder", dims={"B": 1, "S": 2}, seed=0)
    for name in ("self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.fc1.weight"):
        w = m.get_parameter(f"layers.0.{name}")
        want = beta * math.sqrt(2.0 / (w.shape[0] + w.shape[1]))
        assert abs(w.std().item() / want - 1) < 0.1, name
    q = m.get_parameter("layers.0.self_attn.q_proj.weight")
    assert abs(q.std().item() / math.sqrt(2.0 / (q.shape[0] + q.shape[1])) - 1) < 0.1


PADDED = """
dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16

block Layer(x: [B, S, D]) -> [B, S, D] {
  attn: self_attention(heads=2)
  bn: batchnorm(D, padding=mask)
  mlp: mlp(F)
  h = x + attn(x)
  n = bn(h)
  y = h + mlp(n)
  return y
}
"""


def _valid_rows_move(text: str) -> bool:
    """Whether changing the padded rows of the input changes the output's valid rows (train mode)."""
    m = blockir.compile(blockir.parse(text, "padded.block"), "Layer", dims={"B": 2, "S": 4}, seed=0)
    keep = torch.ones(2, 4, dtype=torch.long)
    keep[1, 2:] = 0
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0))
    noisy = x.clone()
    noisy[1, 2:] += 5.0
    valid = keep.bool()
    return not torch.allclose(m(x, attention_mask=keep)[valid], m(noisy, attention_mask=keep)[valid], atol=1e-6)


def test_padding_policy_per_value_and_what_it_means() -> None:
    policy = program_manifest(blockir.parse(PADDED, "padded.block"))["blocks"]["Layer"]["padding"]
    assert policy == {"x": "row_local", "%0": "attention_masked", "h": "attention_masked",
                      "n": "batch_stats_masked", "%1": "batch_stats_masked", "y": "batch_stats_masked"}
    assert not _valid_rows_move(PADDED)
    include = PADDED.replace("padding=mask", "padding=include")
    assert program_manifest(blockir.parse(include, "i.block"))["blocks"]["Layer"]["padding"]["y"] == \
        "padding_dependent"
    assert _valid_rows_move(include)


def test_embedding_norm_is_named_as_such() -> None:
    text = (ROOT / "examples" / "peri_ln.block").read_text().replace(
        "model PeriLNModel(x: [B, S, D]) -> [B, S, D] {\n  layers: PeriLNLayer * 4\n  norm: rmsnorm(D, eps=1e-6)\n"
        "  return norm(layers(x))",
        "dim V: vocab = 32\nmodel PeriLNModel(ids: [B, S]) -> [B, S, D] {\n  embed: embedding(V, D)\n"
        "  embed_norm: rmsnorm(D, eps=1e-6)\n  layers: PeriLNLayer * 4\n  norm: rmsnorm(D, eps=1e-6)\n"
        "  return norm(layers(embed_norm(embed(ids))))")
    model = program_manifest(blockir.parse(text, "peri.block"))["blocks"]["PeriLNModel"]
    assert (model["embedding_norm"]["name"], model["embedding_norm"]["placement"]) == ("embed_norm", "embedding")
    assert model["final_norm"]["name"] == "norm" and model["final_norm"]["placement"] == "final"
    assert "embedding_norm" not in _blocks("peri_ln")["PeriLNModel"]


def test_recipe_contract_has_the_seven_fields() -> None:
    for example, block, recipe in (("peri_ln", "PeriLNLayer", "Peri-LN"), ("deepnorm", "DeepNormLayer", "DeepNorm"),
                                   ("rezero", "ReZeroLayer", "ReZero"), ("layerscale", "LayerScaleBlock", "LayerScale"),
                                   ("llama", "LlamaDecoderLayer", "Pre-LN"), ("ngpt", "NGPTLayer", "nGPT")):
        contract = _blocks(example)[block]["recipe_contract"]
        assert contract["recipe"] == recipe
        assert list(contract) == ["recipe", *FIELDS]
        assert all(contract[f] not in (None, "", []) or f == "new_learned_state" for f in FIELDS), recipe
    peri = _blocks("peri_ln")["PeriLNLayer"]["recipe_contract"]
    assert peri["branch_count_and_depth"]["branches_per_layer"] == 2 and peri["branch_count_and_depth"]["layers"] == 4
    rezero = _blocks("rezero")["ReZeroLayer"]["recipe_contract"]
    assert rezero["new_learned_state"] == [{"decl": "resweight", "kind": "scalar"}]


def test_trainer_optimizer_state_and_weight_decay_are_the_manifest_s() -> None:
    from blockir.lifecycle.corpus import Corpus
    from blockir.lifecycle.session import RunConfig, Trainer
    text = PADDED.replace("  bn: batchnorm(D, padding=mask)\n", "").replace("  n = bn(h)\n  y = h + mlp(n)",
                                                                              "  y = h + mlp(h)")
    text += "model M(x: [B, S, D]) -> [B, S, D] {\n  layers: Layer * 1\n  norm: layernorm(D)\n  return norm(layers(x))\n}\n"
    program = blockir.parse(text, "t.block")
    data = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    trainer = Trainer(program, program.block("M"), RunConfig(dims={"B": 2, "S": 8}), Corpus("t", 1, data, data, ""))
    trainer.train_step(trainer.next_batch())
    opt = run_manifest(program)["training"]["optimizer"]
    assert type(trainer.optimizer).__name__ == opt["name"]
    assert {k for state in trainer.optimizer.state.values() for k in state} == set(opt["state"])
    assert {g["weight_decay"] for g in trainer.optimizer.param_groups} == {opt["weight_decay"]}
    ngpt = blockir.load(ROOT / "examples" / "ngpt.block")
    assert run_manifest(ngpt)["training"]["optimizer"]["weight_decay"] == 0.0


def test_keyed_dropout_and_recompute_facts_hold() -> None:
    from blockir.lower import fx
    from blockir.lower.layers import numerics
    from blockir.lower.rng import dropout_key
    assert runtime_facts.KEYED_DROPOUT["key"] == ["seed", "layer", "site", "row", "column"]
    x = torch.ones(3, 5)
    seed = torch.tensor(12345, dtype=torch.int64)
    # the mask is the key (seed, layer, CRC-32 of the value name) over (row, column): recomputed, it replays
    a = fx.dropout_site(x, 0.5, "element", True, seed, 2, fx.site_id("h"))
    b = numerics.dropout(x, 0.5, "element", True, dropout_key(seed, 2, fx.site_id("h")))
    assert torch.equal(a, b) and fx.site_id("h") == __import__("zlib").crc32(b"h")
    m = blockir.compile(ROOT / "examples" / "llama.block", "LlamaDecoderLayer", dims={"B": 1, "S": 2}, seed=0)
    targets = {str(n.target) for sub in m.modules() if hasattr(sub, "graph") for n in sub.graph.nodes}
    assert not any("checkpoint" in t for t in targets)
    assert runtime_facts.RECOMPUTE["activation_checkpointing"] is False


def test_runtime_parallel_layout_and_backend(tmp_path) -> None:
    path = ROOT / "tests" / "distributed" / "stated_attention_dropout.block"
    sharded = blockir.parse(path.read_text(), str(path))
    assert run_manifest(sharded)["runtime"]["parallel"] == {"mesh": ["tp"], "placements": "parallel_layout"}
    assert run_manifest(blockir.load(ROOT / "examples" / "llama.block"))["runtime"]["parallel"]["mesh"] == []
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["show", str(ROOT / "examples" / "llama.block"), "--format", "manifest", "--fuse",
                     "--manifest-format", "json"]) == 0
    data = json.loads(out.getvalue())
    assert data["runtime"]["backend"] == "fused" and "fused_boundaries" in data["tensors"]
    assert set(data) == {"file", "blocks", "training", "runtime", "tensors"}


def test_manifest_records_aliases_layouts_buffers_and_counters() -> None:
    from test_verify_keys import TIED
    blocks = program_manifest(blockir.parse(TIED, "tied.block"))["blocks"]
    head = next(k for k in blocks["LM"]["checkpoint"] if k["key"] == "lm_head.weight")
    assert head == {"key": "lm_head.weight", "shape": [32, 16], "role": "parameter", "layout": "out,in",
                    "alias_of": "embed_tokens.weight"}
    layer = {k["key"]: k for k in blocks["Layer"]["checkpoint"]}
    assert (layer["attn.qkv_proj.weight"]["layout"], layer["attn.qkv_proj.weight"]["fused"]) == ("in,out", "q;k;v")
    assert [k for k, v in layer.items() if v["role"] != "parameter"] == [
        "ln_2.running_mean", "ln_2.running_var", "ln_2.num_batches_tracked", "ln_2.calibrated_at"]
    assert [v["role"] for v in layer.values() if v["role"] != "parameter"] == ["buffer", "buffer", "counter", "counter"]
    assert all(not k.startswith("layers.") for k in (e["key"] for e in blocks["LM"]["checkpoint"]))


def test_parameter_count_skips_buffers_counters_and_aliases() -> None:
    from test_verify_keys import TIED
    from blockir.reports.model_size import model_size
    program = blockir.parse(TIED, "tied.block")
    m = blockir.compile(program, "LM", dims={"B": 2, "S": 4}, seed=0)
    assert model_size(program, "LM", {"B": 2, "S": 4}).parameters == sum(p.numel() for p in m.parameters())


def test_recipe_command_reports_the_contract() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["recipe", "tfixup", str(ROOT / "examples" / "llama.block"), "--block", "LlamaDecoderLayer",
                     "--format", "json"]) == 0
    contract = json.loads(out.getvalue())["contract"]
    assert list(contract) == ["recipe", *FIELDS] and contract["recipe"] == "T-Fixup"
    assert contract["optimizer_warmup_regularization"] == "no warmup; no norms"
    assert contract["branch_count_and_depth"] == {"branches_per_layer": 2, "layers": 2,
                                                  "convention": "encoder and decoder layer counts"}
