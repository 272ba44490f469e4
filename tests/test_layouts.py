"""Layouts at block boundaries: parsed, printed back, checked where written, carried through blocks."""
from __future__ import annotations

import pytest

import blockir
from blockir.analyses.layouts import describe_layout, layouts
from blockir.ir.printer import format_program

HEAD = "dim B: batch\ndim S: seq\ndim D: model = 8\ndim F: hidden = 32\ndim tp: mesh\n"
SP = HEAD + """block Layer(x: [B, S, D]) -> [B, S, D] {
  norm: layernorm(D)
  mlp: mlp(F)
  f: extern(x: [B, S, D; tp=replicate]) -> [B, S, D; tp=shard(S)]
  h = x + mlp(norm(x))
  return h
}

model M(x: [B, S, D; tp=shard(S)]) -> [B, S, D; tp=shard(S)] {
  layers: Layer * 2
  norm: layernorm(D)
  return norm(layers(x))
}
"""


def test_layouts_round_trip_through_the_printer() -> None:
    prog = blockir.parse(SP, "sp.block")
    text = format_program(prog)
    assert "model M(x: [B, S, D; tp=shard(S)]) -> [B, S, D; tp=shard(S)] {" in text
    assert "f: extern(x: [B, S, D; tp=replicate]) -> [B, S, D; tp=shard(S)]" in text
    assert blockir.parse(text, "sp.block") == prog


def test_an_unannotated_layer_inherits_the_models_layout() -> None:
    prog = blockir.parse(SP.replace("  f: extern(x: [B, S, D; tp=replicate]) -> [B, S, D; tp=shard(S)]\n", ""), "sp.block")
    assert blockir.verify(prog) == []
    model = layouts(prog, prog.block("M"))
    (layer,) = {id(c): c for c in model.contexts() if c.block.name == "Layer"}.values()
    assert describe_layout(layer.of("h")) == "tp=shard(S)"
    assert describe_layout(layouts(prog, prog.block("Layer")).of("h")) == "replicated"


@pytest.mark.parametrize("typ, code, message", [
    ("[B, S, D; tq=shard(S)]", "E0101", "undefined mesh axis 'tq'"),
    ("[B, S, D; S=shard(S)]", "E0111", "'S' is a seq axis, not a mesh axis"),
    ("[B, S, D; tp=shard(F)]", "E0111", "'tp' shards F, which is not an axis of [B, S, D]"),
    ("[B, S, D; tp=split(S)]", "E0107", "a placement is one of replicate, shard, partial, got 'split'"),
    ("[B, S, D; tp=shard]", "E0106", "shard names the tensor axis it splits: shard(S)"),
    ("[B, S, D; tp=partial(S)]", "E0106", "partial takes no axis"),
    ("[B, S, D; tp=replicate, tp=partial]", "E0102", "mesh axis 'tp' is placed twice"),
    ("[B, tp, D]", "E0111", "'tp' is a mesh axis, not a tensor axis"),
])
def test_a_bad_placement_is_reported_where_it_is_written(typ: str, code: str, message: str) -> None:
    text = HEAD + f"block L(x: {typ}) -> [B, S, D] {{\n  return x\n}}\n"
    with pytest.raises(blockir.BlockError) as info:
        blockir.parse(text, "bad.block")
    assert [(d.code, d.message, d.span.line) for d in info.value.diagnostics][0] == (code, message, 6)


def test_the_manifest_states_parallel_layout_when_the_file_has_a_mesh() -> None:
    from blockir.analyses.manifest import program_manifest
    prog = blockir.parse(SP.replace("  f: extern(x: [B, S, D; tp=replicate]) -> [B, S, D; tp=shard(S)]\n", ""), "sp.block")
    pl = program_manifest(prog)["parallel_layout"]
    assert pl["mesh"] == ["tp"]
    model = pl["blocks"]["M"]
    assert model["inputs"] == {"x": "tp=shard(S)"}
    assert model["output"] == "tp=shard(S)"
    assert model["stream"] == "sequence"
    assert model["params"]["layers.0.mlp.fc1.weight"] == "shard(0)"
    assert model["params"]["layers.1.mlp.fc2.weight"] == "shard(1)"
    assert model["params"]["layers.1.mlp.fc2.bias"] == "replicate"
    assert model["params"]["norm.weight"] == "replicate (gradient summed over tp)"
    layer = pl["blocks"]["Layer"]  # analysed under its own (absent) declarations
    assert (layer["inputs"], layer["output"], layer["stream"]) == ({"x": "replicated"}, "replicated", "replicated")
    assert layer["params"]["norm.weight"] == "replicate"


def test_the_manifest_has_no_parallel_layout_without_a_mesh() -> None:
    from blockir.analyses.manifest import program_manifest
    from conftest import ROOT
    assert "parallel_layout" not in program_manifest(blockir.load(ROOT / "examples" / "llama.block"))


@pytest.mark.parametrize("head", [HEAD, HEAD.replace("dim tp: mesh\n", "")])
def test_attention_dropout_verifies_with_or_without_a_mesh_axis(head: str) -> None:
    """Its keep decisions are keyed by logical coordinates, as every dropout's: a rank draws the unsharded masks."""
    prog = blockir.parse(head + f"""dim H: heads = 2
block Layer(x: [B, S, D]) -> [B, S, D] {{
  norm: layernorm(D)
  attn: self_attention(heads=H, causal=true, dropout=0.1)
  h = x + dropout(attn(norm(x)), p=0.1)
  return h
}}
""", "attn.block")
    assert blockir.verify(prog) == []


DIFF = HEAD + """block Layer(x: [B, S, D; tp=shard(S)]) -> [B, S, D; tp=shard(S)] {
  f: extern(x: [B, S, D; tp=shard(S)]) -> [B, S, D; PLACED]
  d = x - f(x)
  return d
}
"""


def test_a_difference_keeps_its_operands_placement() -> None:
    prog = blockir.parse(DIFF.replace("PLACED", "tp=shard(S)"), "diff.block")
    assert blockir.verify(prog) == []
    assert describe_layout(layouts(prog, prog.block("Layer")).of("d")) == "tp=shard(S)"


@pytest.mark.parametrize("placed, code, message", [
    ("tp=replicate", "E0601", "operands of '-' are placed differently: 'x' is tp=shard(S), 'f(…)' is replicated"),
    ("tp=partial", "E0602", ("'f(…)' is a pending sum over tp subtracted from 'x' (tp=shard(S)): every rank would "
                             "apply the other operand, and reducing afterwards counts it once per rank")),
])
def test_a_difference_of_differently_placed_values_is_refused(placed: str, code: str, message: str) -> None:
    prog = blockir.parse(DIFF.replace("PLACED", placed), "diff.block")
    assert [(d.code, d.message, d.span.line, d.span.column) for d in blockir.verify(prog)] == [(code, message, 8, 7)]
