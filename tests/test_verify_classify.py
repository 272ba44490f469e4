"""Topology classification of every example, the registry patterns, and the block manifest."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import networkx as nx
import pytest
import yaml

import blockir
from blockir.analyses.manifest import program_manifest
from blockir.analyses.structure import wrapper
from blockir.cli import main
from blockir.analyses.classify import REGISTRY, classify_program, match_registry, wrapper_graph
from blockir.passes.fuse import fuse_program
from conftest import ROOT

# (file, block) -> topology, each checked against the real layer's forward
EXPECTED = {
    ("bert", "BertLayer"): "post_ln",  # LayerNorm(x + dropout(dense(attn(x))))
    ("deepnorm", "DeepNormLayer"): "scaled_residual",  # LayerNorm(alpha * x + f(x))
    ("deepnorm", "DeepNormDecoder"): "stack",
    ("deepscalelm", "DeepScaleLMLayer"): "deepscalelm",  # skip_scale * x + branch_scale * f(n(x))
    ("deepscalelm", "DeepScaleLMDecoder"): "stack",
    ("fixup", "FixupLayer"): "fixup",  # x + s * f(x + a) + b: one multiplier and the biases, no norm
    ("fixup", "FixupDecoder"): "stack",
    ("dyt", "DyTBlock"): "dyt",  # Pre-LN with DyT at every norm site
    ("dyt", "DyTModel"): "stack",
    ("encoder_decoder", "EncoderLayer"): "pre_ln",  # Harvard SublayerConnection
    ("encoder_decoder", "DecoderLayer"): "pre_ln",
    ("encoder_decoder", "Encoder"): "stack",
    ("encoder_decoder", "Decoder"): "stack",
    ("gemma2", "Gemma2DecoderLayer"): "peri_ln",  # x + post_norm(f(pre_norm(x)))
    ("gpt2", "GPT2Block"): "pre_ln",
    ("gpt_neox", "GPTNeoXLayer"): "parallel",  # use_parallel_residual, two norms
    ("layerscale", "LayerScaleBlock"): "layerscale",
    ("layerscale", "LayerScaleEncoder"): "stack",
    ("llama", "LlamaDecoderLayer"): "pre_ln",
    ("llama", "LlamaModel"): "stack",
    ("moe", "MixtralDecoderLayer"): "pre_ln",
    ("moe", "MixtralModel"): "stack",
    ("ngpt", "NGPTLayer"): "ngpt",  # unit(x + alpha * (unit(f(x)) - x))
    ("ngpt", "NGPT"): "stack",
    ("normformer", "NormFormerLayer"): "normformer",  # Pre-LN plus head scales, attention output norm, FFN norm
    ("normformer", "NormFormerModel"): "stack",
    ("olmo2", "Olmo2DecoderLayer"): "branch_output_norm",  # x + norm(f(x))
    ("parallel", "ParallelBlock"): "parallel_shared_norm",  # GPT-J: one ln_1 feeds both branches
    ("parallel", "ParallelModel"): "stack",
    ("peri_ln", "PeriLNLayer"): "peri_ln",
    ("peri_ln", "PeriLNModel"): "stack",
    ("rezero", "ReZeroLayer"): "rezero",
    ("rezero", "ReZeroModel"): "stack",
    ("t5", "T5LayerFF"): "pre_ln",
    ("torch_encoder", "TransformerEncoderLayer"): "post_ln",  # norm_first=False
    ("torch_encoder", "TransformerEncoderLayerNormFirst"): "pre_ln",  # norm_first=True
    ("prepbn", "PRepBNBlock"): "pre_ln",  # x + f(PRepBN(x)): the norms change, not where they sit
    ("partial_rmsnorm", "PartialRMSNormLayer"): "pre_ln",  # the RMS of a share of the row: placement unchanged
    ("partial_rmsnorm", "PartialRMSNormModel"): "stack",
    ("powernorm", "PowerNormLayer"): "post_ln",  # norm(x + f(x)) with batch quadratic means, as the paper trains
    ("powernorm", "PowerNormDecoder"): "stack",
    ("realformer", "RealFormerLayer"): "post_ln",  # the carried scores do not change the hidden stream's topology
    ("realformer", "RealFormer"): "stack",
    ("unet_skip", "Layer"): "pre_ln",
    ("unet_skip", "UNet"): "stack",
}


def _program(stem: str) -> blockir.ir.Program:
    path = ROOT / "examples" / f"{stem}.block"
    return blockir.parse(path.read_text(), str(path))


@pytest.mark.parametrize(("stem", "block"), sorted(EXPECTED), ids=lambda v: v)
def test_classifies_example(stem: str, block: str) -> None:
    assert classify_program(_program(stem))[block].topology == EXPECTED[(stem, block)]


def test_every_example_block_is_covered() -> None:
    covered = {(stem, b.name) for stem in {s for s, _ in EXPECTED} for b in _program(stem).blocks}
    assert covered == set(EXPECTED)
    assert {p.stem for p in (ROOT / "examples").glob("*.block")} == {s for s, _ in EXPECTED}


@pytest.mark.parametrize("stem", sorted({s for s, _ in EXPECTED}))
def test_classification_survives_fusion(stem: str) -> None:
    program = _program(stem)
    fused, _ = fuse_program(program)
    assert {n: c.topology for n, c in classify_program(fused).items()} == \
        {n: c.topology for n, c in classify_program(program).items()}


def test_branch_orders_and_forms() -> None:
    decoder = classify_program(_program("encoder_decoder"))["DecoderLayer"]
    assert decoder.branch_order == ("causal_self_attention", "cross_attention", "mlp")
    assert decoder.placements == ("pre", "pre", "pre")
    neox = classify_program(_program("gpt_neox"))["GPTNeoXLayer"]
    assert (neox.form, neox.branch_order) == ("parallel", ("extern:mlp", "extern:attention"))
    llama = classify_program(_program("llama"))
    assert llama["LlamaDecoderLayer"].form == "sequential"
    assert (llama["LlamaModel"].members[0].count, llama["LlamaModel"].final_norm) == (2, "norm")


def test_registry_patterns_are_matched_by_isomorphism() -> None:
    block = _program("llama").block("LlamaDecoderLayer")
    g = wrapper_graph(wrapper(block))
    pre_ln = next(t for t in REGISTRY if t.name == "pre_ln").pattern((1, 1))
    assert nx.is_isomorphic(g, pre_ln, node_match=lambda a, b: a["label"] == b["label"])
    assert sorted(nx.get_node_attributes(g, "label").values()) == ["add", "add", "branch", "branch", "norm", "norm",
                                                                    "state"]
    assert match_registry(wrapper(block)) == "pre_ln"


def test_unknown_wiring_is_custom() -> None:
    program = blockir.parse("""dim B: batch
dim S: seq
dim D: model = 8
block W(x: [B, S, D]) -> [B, S, D] {
  n1: layernorm(D)
  n2: layernorm(D)
  n3: layernorm(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = x + n3(f(n2(f(n1(x)))))
  return y
}
""")
    assert classify_program(program)["W"].topology == "custom"


def test_manifest_fields_of_llama() -> None:
    m = program_manifest(_program("llama"))["blocks"]
    layer = m["LlamaDecoderLayer"]
    assert (layer["topology"], layer["state_layout"], layer["branch_order"]) == \
        ("pre_ln", ["batch", "seq", "model"], ["causal_self_attention", "gated_mlp"])
    assert layer["norm"] == {"family": "rmsnorm", "placement": "pre_branch", "reduction_axes": ["D"],
                             "epsilon": 1e-6, "center": False, "scale": "per_channel", "bias": False}
    assert layer["residual"]["shortcut_scale"] == [1.0, 1.0]
    assert [u[0]["dropout"] for u in layer["residual"]["updates"]] == [0.0, 0.0]
    model = m["LlamaModel"]
    assert model["layers"] == [{"name": "layers", "block": "LlamaDecoderLayer", "count": 2, "topology": "pre_ln"}]
    assert (model["final_norm"]["family"], model["final_norm"]["placement"]) == ("rmsnorm", "final")


def test_manifest_scales_and_dropout() -> None:
    deep = program_manifest(_program("deepnorm"))["blocks"]["DeepNormLayer"]
    assert deep["residual"]["shortcut_scale"] == [pytest.approx(48 ** 0.25)] * 2
    assert deep["norm"]["placement"] == "post_add"
    ls = program_manifest(_program("layerscale"))["blocks"]["LayerScaleBlock"]
    update = ls["residual"]["updates"][0][0]
    assert update["scale"] == {"learned": "vector", "name": "ls1.gamma", "init": 1e-5}
    assert update["dropout"] == {"p": 0.1, "mask": "sample"}
    torch_post = program_manifest(_program("torch_encoder"))["blocks"]["TransformerEncoderLayer"]
    assert torch_post["inner_dropout"] == [{"value": "%5", "p": 0.1, "mask": "element"}]


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_show_manifest_cli(fmt: str) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["show", str(ROOT / "examples" / "gpt_neox.block"), "--format", "manifest",
                     "--manifest-format", fmt]) == 0
    data = yaml.safe_load(out.getvalue()) if fmt == "yaml" else json.loads(out.getvalue())
    layer = data["blocks"]["GPTNeoXLayer"]
    assert (layer["topology"], layer["residual_form"]) == ("parallel", "parallel")
