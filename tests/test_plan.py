"""`blockir plan` and the derived plan: placements equal a hand-written torchtitan-style plan, collective
counts equal the closed forms for Megatron tensor and sequence parallelism."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

import blockir
from blockir.analyses.parallel import GATHER, REDUCE, derive_plan
from blockir.analyses.sizes import Sizes
from blockir.cli import main
from blockir.commands.plan import CLOSED_FORM
from conftest import ROOT
from test_docs import fences

LLAMA = str(ROOT / "examples" / "llama.block")

# What torchtitan's parallelize_llama writes by hand for one decoder layer under sequence parallelism
# (its module names mapped to the HF names the block declares).
HAND_WRITTEN = {
    "input_layernorm": "norm", "post_attention_layernorm": "norm",
    "self_attn": "branch", "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise", "self_attn.o_proj": "rowwise",
    "mlp": "branch", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise",
}


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_llama_plan_matches_the_hand_written_one() -> None:
    code, out, _ = _run("plan", LLAMA, "--block", "LlamaModel", "--tp", "2", "--layout", "sequence", "--format", "json")
    assert code == 0
    report = json.loads(out)
    expected = {"norm": "norm"} | {f"layers.{i}.{k}": v for i in range(2) for k, v in HAND_WRITTEN.items()}
    assert report["modules"] == expected
    assert report["params"]["layers.1.self_attn.o_proj.weight"] == "shard(1)"
    assert report["params"]["layers.0.mlp.gate_proj.weight"] == "shard(0)"
    assert report["params"]["norm.weight"].startswith("replicate")


def test_collectives_follow_the_closed_forms() -> None:
    prog = blockir.load(LLAMA)
    sizes = Sizes.of(prog, {"B": 2, "S": 8})
    for layout, form in CLOSED_FORM.items():
        plan = derive_plan(prog, prog.block("LlamaModel"), sizes, layout, 2)
        for layer in ("layers.0", "layers.1"):
            ops = [c.op for c in plan.collectives[layer]]
            assert {op: ops.count(op) for op in set(ops)} == form, layout
        # the stream, B·S·D; under the context layout the keys and the values, B·S·kv_heads·head_dim
        stream = 2 * 8 * 64 if layout != "context" else 2 * 8 * 2 * 16
        big = [c for c in plan.collectives["layers.0"] if c.op != "all-reduce" or layout == "replicated"]
        assert all(c.elements == stream for c in big)
        # ring volumes: all-reduce sends 2(P-1)/P of the payload, the others (P-1)/P
        assert {c.wire_bytes(2, 2) for c in big} == ({2 * stream} if layout == "replicated" else {stream})


# The same layer over four ranks, as vLLM and Megatron-LM lay it out when ranks outnumber the 2 key/value
# heads: one query head per rank, k/v replicated so each rank computes the key/value head its query head reads.
HAND_WRITTEN_TP4 = HAND_WRITTEN | {"self_attn.k_proj": "kv_replicated", "self_attn.v_proj": "kv_replicated"}


def test_llama_over_four_ranks_replicates_key_value_heads() -> None:
    code, out, _ = _run("plan", LLAMA, "--block", "LlamaModel", "--tp", "4", "--layout", "sequence", "--format", "json")
    assert code == 0
    report = json.loads(out)
    expected = {"norm": "norm"} | {f"layers.{i}.{k}": v for i in range(2) for k, v in HAND_WRITTEN_TP4.items()}
    assert report["modules"] == expected
    params = report["params"]
    assert params["layers.0.self_attn.q_proj.weight"] == "shard(0)"
    assert params["layers.0.self_attn.k_proj.weight"] == params["layers.1.self_attn.v_proj.weight"] == \
        "replicate (each rank computes the key/value head of its query heads)"
    assert params["layers.0.mlp.down_proj.weight"] == "shard(1)"
    # replication changes no collective: still two all-gathers and two reduce-scatters per layer
    ops = [c["op"] for c in report["collectives"]["layers.0"]]
    assert sorted(ops) == ["all-gather", "all-gather", "reduce-scatter", "reduce-scatter"]


def test_a_degree_that_splits_a_head_is_a_located_error() -> None:
    code, out, err = _run("plan", LLAMA, "--block", "LlamaModel", "--tp", "8")
    assert code == 1 and out == ""
    assert "error[E0730]: self_attention 'self_attn' has 4 heads, which 8 ranks cannot split evenly" in err
    assert "examples/llama.block:26:3: error" in err


def test_key_value_heads_neither_split_nor_shared_are_a_located_error() -> None:
    prog = blockir.load(LLAMA)
    try:
        derive_plan(prog, prog.block("LlamaModel"), Sizes.of(prog, {"B": 2, "S": 12, "H": 12}), "sequence", 3)
    except blockir.BlockError as e:
        assert [d.code for d in e.diagnostics] == ["E0730"]
        assert e.diagnostics[0].message == \
            "self_attention 'self_attn' has 2 key/value heads, which 3 ranks can neither split evenly nor share whole"
    else:
        raise AssertionError("a degree that neither divides nor is a multiple of the key/value heads was accepted")


def test_hidden_norms_all_reduce_one_sum_per_row_reduction() -> None:
    """RMSNorm reduces Σx² per row, a LayerNorm Σx and Σx² (written out or run as one kernel on one device):
    the all-reduce carries that many elements per row."""
    rows = 2 * 8
    families = (ROOT / "tests" / "distributed" / "families.block").read_text()
    two_pass = families.replace("ln_1: layernorm(D, eps=1e-5, bias=true)", "ln_1: layernorm(D, eps=1e-5, bias=true, two_pass=true)")
    for prog, name, norm, expected in (
            (blockir.load(LLAMA), "LlamaModel", "layers.0.input_layernorm", [("all-reduce", rows)]),
            (blockir.parse(two_pass, "families.block"), "GPT2Model", "h.0.ln_1", [("all-reduce", 2 * rows)]),
            (blockir.parse(families, "families.block"), "GPT2Model", "h.0.ln_1", [("all-reduce", 2 * rows)])):
        plan = derive_plan(prog, prog.block(name), Sizes.of(prog, {"B": 2, "S": 8}), "hidden", 2)
        layer = norm.rsplit(".", 1)[0]
        assert [(c.op, c.elements) for c in plan.collectives[layer] if c.site == norm] == expected, norm


def _plans(program: blockir.ir.program.Program, world: int, dims: dict[str, int]) -> list[tuple[str, str, set, set]]:
    """(block, layout, plan's keys, state_dict keys) for every block of ``program`` under every layout."""
    from blockir.analyses.keys import param_keys
    out = []
    for block in program.blocks:
        keys = {k.name for k in param_keys(program, block.name, dims).keys}
        for layout in ("replicated", "sequence", "hidden"):
            plan = derive_plan(program, block, Sizes.of(program, dims), layout, world)
            out.append((block.name, layout, set(plan.params), keys))
    return out


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.block")), ids=lambda p: p.stem)
def test_the_plan_places_every_key_of_every_example(path) -> None:
    for block, layout, placed, keys in _plans(blockir.load(path), 2, {"B": 2, "S": 8}):
        assert placed == keys, (block, layout, placed ^ keys)


MOE = ROOT / "examples" / "moe.block"


def test_a_mixture_of_experts_is_split_inside_its_experts() -> None:
    """Each expert's gate/up rows (a slice of the gate block and of the up block) and down columns by hidden
    units, the router replicated: `blockir plan` lists every expert key with its placement."""
    code, out, _ = _run("plan", str(MOE), "--tp", "2", "--layout", "hidden")
    assert code == 0
    for i in range(2):
        assert f"  layers.{i}.mlp.gate.weight                  replicate (gradient summed over tp)\n" in out
        assert f"  layers.{i}.mlp.experts.gate_up_proj         shard(1) within each of its 2 stacked blocks\n" in out
        assert f"  layers.{i}.mlp.experts.down_proj            shard(2)\n" in out
    code, out, _ = _run("plan", str(MOE), "--tp", "2", "--format", "json")
    assert json.loads(out)["modules"]["layers.1.mlp"] == "moe"


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe"])
def test_every_imported_mixture_of_experts_is_placed_whole(family: str) -> None:
    """The keys of each family the importer writes a ``moe`` for (GraniteMoE's router named ``router``)."""
    from blockir.api import hf_block_text as block_text
    from hf_configs import CONFIGS
    program = blockir.parse(block_text(CONFIGS[family]), f"{family}.block")
    for block, layout, placed, keys in _plans(program, 2, {"B": 2, "S": 8}):
        assert placed == keys, (block, layout, placed ^ keys)
    placed = {k for k in placed if ".mlp." in k or ".block_sparse_moe." in k}
    assert any(k.endswith(".experts.down_proj") for k in placed) and len(placed) >= 6


@pytest.mark.parametrize("layout", ["replicated", "sequence", "hidden"])
def test_a_mixture_of_experts_sends_what_a_gated_mlp_sends(layout: str) -> None:
    """The branch input gathered once and the experts' pending sum reduced once, forward and backward: the
    same collectives, of the same payload, as the gated MLP in its place (whose reduction sits at its down
    projection)."""
    moe = blockir.load(MOE)
    text = MOE.read_text().replace("mlp: moe(F, experts=4, top_k=2, norm_topk=true)", "mlp: gated_mlp(F)")
    dense = blockir.parse(text, "moe.block")
    sizes = {"B": 2, "S": 8}
    found = []
    for prog in (moe, dense):
        plan = derive_plan(prog, prog.block("MixtralModel"), Sizes.of(prog, sizes), layout, 2)
        found.append([[(c.op, c.elements) for c in listed["layers.0"] if c.site.startswith("layers.0.mlp")]
                      for listed in (plan.collectives, plan.backward)])
    assert found[0] == found[1]
    assert found[0][0] == [(op, 2 * 8 * 32) for op in (GATHER[layout], REDUCE[layout]) if op]  # B·S·D


def test_a_shared_expert_is_split_as_a_gated_mlp_and_its_gate_replicated() -> None:
    program = blockir.parse(MOE.read_text().replace("dim H: heads = 4", "dim H: heads = 4\ndim G: hidden = 40").replace(
        "norm_topk=true)", "norm_topk=true, shared=G, shared_gate=true)"), "moe.block")
    plan = derive_plan(program, program.block("MixtralModel"), Sizes.of(program, {"B": 2, "S": 8}), "sequence", 2)
    assert {k: v for k, v in plan.params.items() if k.startswith("layers.0.mlp.shared")} == {
        "layers.0.mlp.shared_expert.gate_proj.weight": "shard(0)",
        "layers.0.mlp.shared_expert.up_proj.weight": "shard(0)",
        "layers.0.mlp.shared_expert.down_proj.weight": "shard(1)",
        "layers.0.mlp.shared_expert_gate.weight": "replicate (gradient summed over tp)"}


SHARED = {"dim H: heads = 4": "dim H: heads = 4\ndim G: hidden = 34", "norm_topk=true)": "norm_topk=true, shared=G)"}


@pytest.mark.parametrize("changes, message", [
    ({"dim F: hidden = 48": "dim F: hidden = 50"}, "moe 'mlp' has 50 hidden units per expert, which 4 ranks cannot "
                                                   "split evenly"),
    (SHARED, "moe 'mlp' has 34 hidden units in its shared expert, which 4 ranks cannot split evenly")])
def test_experts_the_ranks_cannot_split_are_refused_at_their_declaration(changes, message) -> None:
    text = MOE.read_text()
    for old, new in changes.items():
        text = text.replace(old, new)
    program = blockir.parse(text, "moe.block")
    with pytest.raises(blockir.BlockError) as info:
        derive_plan(program, program.block("MixtralModel"), Sizes.of(program, {"B": 2, "S": 8}), "sequence", 4)
    (d,) = info.value.diagnostics
    line = next(i for i, row in enumerate(text.splitlines(), 1) if row.startswith("  mlp: moe("))
    assert (d.code, d.span.line, d.span.column, d.message) == ("E0645", line, 3, message)
    assert d.hint == "tensor parallelism splits each expert by hidden units: choose a degree that divides " + \
        message.split(" has ")[1].split(" ")[0]


def test_the_documented_expert_refusal_renders_as_shown(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    body = (ROOT / "docs" / "diagnostics.md").read_text().split("## E0645 ")[1].split("\n## ")[0]
    wrong, shown = fences(body)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "example.block").write_text(wrong.body)
    code, out, err = _run("plan", "example.block", "--tp", "4")
    assert (code, out, err) == (1, "", shown.body)
    assert _run("plan", "example.block", "--tp", "2")[0] == 0


def test_the_plan_places_every_key_of_the_docs_snippets_with_a_mesh() -> None:
    checked = 0
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for fence in fences(doc.read_text()):
            if fence.lang != "block" or ": mesh" not in fence.body:
                continue
            program = blockir.parse(fence.body, f"{doc.name}:{fence.line}")
            for block, layout, placed, keys in _plans(program, 1, {"B": 2, "S": 8}):
                assert placed == keys, (doc.name, fence.line, block, layout, placed ^ keys)
                checked += 1
    assert checked >= 30


def test_head_parameters_are_placed() -> None:
    """q/k norms per head are one gain every rank applies to its own heads; nGPT's s_qk splits with them."""
    ngpt = blockir.load(ROOT / "examples" / "ngpt.block")
    plan = derive_plan(ngpt, ngpt.block("NGPT"), Sizes.of(ngpt, {"B": 2, "S": 8}), "sequence", 2)
    assert plan.params["layers.0.attn.qk_scale"] == "shard(0)"
    # one key/value head over two ranks: each rank computes it, but its gain belongs to query head 0 alone
    mqa = blockir.parse((ROOT / "examples" / "ngpt.block").read_text().replace("qk_scale=true)", "qk_scale=true, "
                                                                                "kv_heads=1)"), "ngpt.block")
    with pytest.raises(blockir.BlockError, match="cannot place 'layers.0.attn.qk_scale', 'layers.1.attn.qk_scale'"):
        derive_plan(mqa, mqa.block("NGPT"), Sizes.of(mqa, {"B": 2, "S": 8}), "sequence", 2)
    text = (ROOT / "tests" / "distributed" / "families.block").read_text().replace(
        "attn: self_attention(heads=H, causal=true, bias=true, out_bias=true)",
        "attn: self_attention(heads=H, causal=true, bias=true, out_bias=true, qk_norm=layernorm, qk_norm_axis=head, "
        "q_norm=ln_q)")
    prog = blockir.parse(text, "families.block")
    plan = derive_plan(prog, prog.block("GPT2Model"), Sizes.of(prog, {"B": 2, "S": 8}), "hidden", 2)
    summed = "replicate (gradient summed over tp)"
    assert {k: v for k, v in plan.params.items() if k.startswith(("h.0.attn.ln_q.", "h.0.attn.k_norm."))} == {
        "h.0.attn.ln_q.weight": summed, "h.0.attn.ln_q.bias": summed,
        "h.0.attn.k_norm.weight": summed, "h.0.attn.k_norm.bias": summed}


@pytest.mark.parametrize("change, unplaced", [
    ("kv_heads=1, bias=true, out_bias=true, qk_norm=l2norm, qk_scale=true)", "'h.0.attn.qk_scale', 'h.1.attn.qk_scale'"),
])
def test_a_key_the_plan_cannot_place_is_a_located_error(change: str, unplaced: str) -> None:
    """nGPT's s_qk gives a key head its group's first query gain, which a rank computing a replicated key/value
    head need not hold: the plan names what it cannot place instead of
    leaving it out."""
    text = (ROOT / "tests" / "distributed" / "families.block").read_text().replace(
        "attn: self_attention(heads=H, causal=true, bias=true, out_bias=true)",
        "attn: self_attention(heads=H, causal=true, " + change)
    prog = blockir.parse(text, "families.block")
    with pytest.raises(blockir.BlockError) as info:
        derive_plan(prog, prog.block("GPT2Model"), Sizes.of(prog, {"B": 2, "S": 8}), "sequence", 2)
    (d,) = info.value.diagnostics
    assert (d.code, d.span.line, d.span.column) == ("E0607", 16, 3)
    assert d.message == (f"the sequence tensor-parallel plan over 2 ranks cannot place {unplaced}: self_attention "
                         "'attn' has no sharding that keeps whole heads or units on each rank")


def test_a_key_norm_over_replicated_key_value_heads_keeps_its_gain_whole() -> None:
    """A q/k norm over the whole width with 1 key/value head over 2 ranks: the query norm's gain is split with the
    query heads, the key norm's replicated (each rank applies its head's slice, a pending-sum gradient); each norm
    sends one all-reduce of its B·S row sums forward and one backward (LayerNorm: Σx and Σx²), no gain slices."""
    text = (ROOT / "tests" / "distributed" / "families.block").read_text().replace(
        "attn: self_attention(heads=H, causal=true, bias=true, out_bias=true)",
        "attn: self_attention(heads=H, kv_heads=1, causal=true, bias=true, out_bias=true, qk_norm=layernorm, "
        "qk_norm_axis=width)")
    prog = blockir.parse(text, "families.block")
    plan = derive_plan(prog, prog.block("GPT2Model"), Sizes.of(prog, {"B": 2, "S": 8}), "sequence", 2)
    shared = "replicate (each rank applies its key/value head's slice; gradient summed over tp)"
    assert {k: v for k, v in plan.params.items() if k.startswith(("h.0.attn.q_norm.", "h.0.attn.k_norm."))} == {
        "h.0.attn.q_norm.weight": "shard(0)", "h.0.attn.q_norm.bias": "shard(0)",
        "h.0.attn.k_norm.weight": shared, "h.0.attn.k_norm.bias": shared}
    assert plan.styles()["h.0.attn.k_norm"] == "kv_width_norm"
    for listed in (plan.collectives, plan.backward):
        assert [(c.site, c.op, c.elements) for c in listed["h.0"] if "_norm" in c.site] == [
            ("h.0.attn.q_norm", "all-reduce", 2 * 16), ("h.0.attn.k_norm", "all-reduce", 2 * 16)]


def test_the_manifest_says_where_the_plan_does_not_apply() -> None:
    """A file that declares a mesh and nGPT's s_qk with one key/value head over its 2 ranks still shows its
    manifest; the block's entry carries the plan's refusal where the placements would be."""
    from blockir.analyses.manifest import program_manifest
    text = (ROOT / "tests" / "distributed" / "families.block").read_text().replace(
        "attn: self_attention(heads=H, causal=true, bias=true, out_bias=true)",
        "attn: self_attention(heads=H, kv_heads=1, causal=true, bias=true, out_bias=true, qk_norm=l2norm, "
        "qk_scale=true)").replace("dim H: heads = 4\n", "dim H: heads = 4\ndim tp: mesh = 2\n")
    prog = blockir.parse(text, "families.block")
    entry = program_manifest(prog)["parallel_layout"]["blocks"]["GPT2Model"]
    assert "params" not in entry
    assert entry["plan_refused"].startswith("E0607: the ")
    assert "'h.0.attn.qk_scale'" in entry["plan_refused"]


STACKED = "shard({dim}) within each of its {n} stacked blocks"
WHOLE = "replicate (each rank computes the columns of its own heads or units)"


@pytest.mark.parametrize("fused, conv1d, weight, bias", [
    ("heads", False, "shard(0)", "shard(0)"), ("heads", True, "shard(1)", "shard(0)"),
    ("stacked", False, STACKED.format(dim=0, n=3), STACKED.format(dim=0, n=3)),
    ("stacked", True, STACKED.format(dim=1, n=3), STACKED.format(dim=0, n=3)),
    ("stacked, kv_heads=2", True, WHOLE, WHOLE)])
def test_a_fused_matrix_is_stored_split_where_each_ranks_columns_are_a_slice_of_equal_blocks(
        fused: str, conv1d: bool, weight: str, bias: str) -> None:
    """Per head q, k, v in turn: one contiguous block of the output features (dim 1 of a transposed Conv1D
    weight); q, k, v stacked with a key/value head per query head: the rank's slice of each of 3 equal blocks;
    with 2 key/value heads for 4 query heads the blocks differ in size and the matrix stays whole."""
    text = (ROOT / "tests" / "distributed" / "families.block").read_text().replace(
        "attn: self_attention(heads=H, causal=true, bias=true, out_bias=true)",
        f"attn: self_attention(heads=H, causal=true, fused={fused}, conv1d={str(conv1d).lower()}, bias=true, "
        "out_bias=true)").replace("mlp: mlp(F, act=gelu_tanh, bias=true)", "mlp: gated_mlp(F, act=silu, fused=true)")
    prog = blockir.parse(text, "families.block")
    plan = derive_plan(prog, prog.block("GPT2Model"), Sizes.of(prog, {"B": 2, "S": 8}), "sequence", 2)
    assert (plan.params["h.0.attn.qkv_proj.weight"], plan.params["h.0.attn.qkv_proj.bias"]) == (weight, bias)
    assert plan.params["h.0.mlp.gate_up_proj.weight"] == STACKED.format(dim=0, n=2)


@pytest.mark.parametrize("world, placement", [(2, "shard(0)"), (4, WHOLE)])
def test_q_v_k_row_groups_split_by_whole_groups_where_the_degree_divides_them(world: int, placement: str) -> None:
    """CodeGen's fused matrix in 2 row groups of [q; v; k]: over 2 ranks each holds one whole group, a plain
    shard; over 4 each rank's head is half a group, three blocks of rows it reads from the whole matrix."""
    text = (ROOT / "tests" / "distributed" / "families.block").read_text().replace(
        "attn: self_attention(heads=H, causal=true, bias=true, out_bias=true)",
        "attn: self_attention(heads=H, causal=true, fused=qvk_groups, qkv_groups=2, bias=true, out_bias=true)")
    prog = blockir.parse(text, "families.block")
    for layout in ("replicated", "sequence", "hidden"):
        plan = derive_plan(prog, prog.block("GPT2Model"), Sizes.of(prog, {"B": 2, "S": 8}), layout, world)
        assert plan.params["h.0.attn.qkv_proj.weight"] == plan.params["h.1.attn.qkv_proj.bias"] == placement
        assert plan.params["h.0.attn.o_proj.weight"] == "shard(1)"
        assert plan.styles()["h.0.attn.qkv_proj"] == "columns"


def test_a_language_models_collectives_carry_the_stream_it_embeds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A model taking token ids [B, S]: each collective moves the [B, S, D] stream, per step with --dims and
    per token (D elements) without; its head gathers the stream's rows under the sequence layout."""
    from blockir.api import hf_block_text as block_text
    from hf_configs import CONFIGS
    path = tmp_path / "llama.block"
    path.write_text(block_text(CONFIGS["llama"]))  # D = 64
    code, out, _ = _run("plan", str(path), "--tp", "2", "--dims", "B=2,S=8", "--dtype", "f32", "--format", "json")
    assert code == 0
    plan = json.loads(out)
    assert {c["elements"] for c in plan["collectives"]["model.layers.0"]} == {2 * 8 * 64}
    assert plan["collectives"]["LlamaForCausalLM"] == [
        dict(site="lm_head", op="all-gather", elements=1024, bytes=4096, wire_bytes=2048)]
    code, out, _ = _run("plan", str(path), "--tp", "2", "--dtype", "bf16")
    assert code == 0 and "stream [B, S, D; tp=shard(S)]" in out
    assert "       128 B payload" in out  # one token of the stream, 64 bf16 elements


def test_the_vocab_parallel_plan_lists_the_embedding_head_and_loss_collectives(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Split by vocabulary rows, the embedding reduces its pending sum onto the stream, the head gathers the
    stream's rows (none under the replicated layout) and the loss all-reduces three values per row."""
    from blockir.api import hf_block_text as block_text
    from hf_configs import CONFIGS
    path = tmp_path / "llama.block"
    path.write_text(block_text(dict(CONFIGS["llama"], vocab_size=64)))  # D = 64, B·S = 16
    stream = dict(elements=1024, bytes=4096)
    expected = {"replicated": [dict(site="model.embed_tokens", op="all-reduce", wire_bytes=4096, **stream)],
                "sequence": [dict(site="model.embed_tokens", op="reduce-scatter", wire_bytes=2048, **stream),
                             dict(site="lm_head", op="all-gather", wire_bytes=2048, **stream)]}
    for layout, model in expected.items():
        code, out, _ = _run("plan", str(path), "--tp", "2", "--layout", layout, "--vocab-parallel",
                            "--dims", "B=2,S=8", "--dtype", "f32", "--format", "json")
        assert code == 0
        plan = json.loads(out)
        assert plan["vocab_parallel"] is True
        assert plan["collectives"]["LlamaForCausalLM"] == model
        loss = dict(site="loss", op="all-reduce", elements=16, bytes=64, wire_bytes=64)  # B·S fp32 values
        assert plan["loss_collectives"] == [loss] * 3
        assert plan["params"]["model.embed_tokens.weight"] == plan["params"]["lm_head.weight"] == "shard(0)"
        assert plan["modules"]["model.embed_tokens"] == "vocab_embedding" and plan["modules"]["lm_head"] == "vocab_head"
    code, out, _ = _run("plan", str(path), "--tp", "2", "--format", "json")
    assert json.loads(out)["loss_collectives"] == [] and json.loads(out)["params"]["lm_head.weight"] == "replicate"
    code, out, _ = _run("plan", str(path), "--tp", "2", "--layout", "replicated", "--vocab-parallel")
    assert "vocabulary split by rows; the loss's backward sends nothing\n" in out


def test_a_vocabulary_the_ranks_cannot_split_is_a_located_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from blockir.api import hf_block_text as block_text
    from hf_configs import CONFIGS
    path = tmp_path / "gpt2.block"
    path.write_text(block_text(CONFIGS["gpt2"]))  # V = 97
    code, out, err = _run("plan", str(path), "--tp", "2", "--vocab-parallel")
    assert code == 1 and out == ""
    assert err.startswith(f"{path}:23:3: error[E0608]: embedding 'transformer.wte' has a vocabulary of 97 rows, "
                          "which 2 ranks cannot split evenly\n")
    prog = blockir.load(LLAMA)
    with pytest.raises(blockir.BlockError) as info:
        derive_plan(prog, prog.block("LlamaModel"), Sizes.of(prog, {"B": 2, "S": 8}), "sequence", 2, vocab=True)
    (d,) = info.value.diagnostics
    assert (d.code, d.span.line, d.message) == (
        "E0609", 34, "model 'LlamaModel' has no token embedding or head to split by vocabulary")


def test_the_plan_lists_backward_collectives_and_per_step_totals() -> None:
    """Backward, each forward fact's dual: a branch input's pending gradient reduced once (all-reduce, or
    reduce-scatter onto a shard), a reduce-scatter's gradient gathered, an all-reduce of a row-parallel output
    sending nothing back; a feature-sharded RMSNorm all-reduces its backward's row sum and gathers its gain's
    gradient slices."""
    stream, rows, width = 2 * 8 * 64, 2 * 8, 64  # B·S·D, B·S, D
    backward = {"replicated": [("all-reduce", "layers.0.self_attn"), ("all-reduce", "layers.0.mlp")],
                "sequence": [("reduce-scatter", "layers.0.self_attn"), ("all-gather", "layers.0.self_attn.o_proj"),
                             ("reduce-scatter", "layers.0.mlp"), ("all-gather", "layers.0.mlp.down_proj")],
                "hidden": [("all-reduce", "layers.0.input_layernorm"), ("all-gather", "layers.0.input_layernorm"),
                           ("reduce-scatter", "layers.0.self_attn"), ("all-gather", "layers.0.self_attn.o_proj"),
                           ("all-reduce", "layers.0.post_attention_layernorm"),
                           ("all-gather", "layers.0.post_attention_layernorm"),
                           ("reduce-scatter", "layers.0.mlp"), ("all-gather", "layers.0.mlp.down_proj")]}
    # the norms' row sums and gain slices beside the stream-sized collectives
    sizes = {"all-reduce": rows, "all-gather": width}
    for layout, expected in backward.items():
        code, out, _ = _run("plan", LLAMA, "--block", "LlamaModel", "--tp", "2", "--layout", layout,
                            "--dims", "B=2,S=8", "--dtype", "f32", "--format", "json")
        assert code == 0
        report = json.loads(out)
        assert [(c["op"], c["site"]) for c in report["backward"]["layers.0"]] == expected
        for c in report["backward"]["layers.0"]:
            elements = sizes[c["op"]] if c["site"].endswith("layernorm") else stream
            assert (c["elements"], c["bytes"]) == (elements, 4 * elements), c
        totals = report["totals"]
        for phase, key in (("forward", "collectives"), ("backward", "backward")):
            cs = [c for layer in report[key].values() for c in layer]
            assert totals[phase] == dict(collectives=len(cs), elements=sum(c["elements"] for c in cs),
                                         bytes=sum(c["bytes"] for c in cs), wire_bytes=sum(c["wire_bytes"] for c in cs))
        assert totals["step"] == {k: totals["forward"][k] + totals["backward"][k] for k in totals["step"]}
        # the module takes and returns full tensors: a split stream is gathered at its output, and the gradient
        # of the input it slices gathered in backward
        boundary = [("all-gather", "", stream)] if layout != "replicated" else []
        for key in ("collectives", "backward"):
            assert [(c["op"], c["site"], c["elements"]) for c in report[key].get("LlamaModel", [])
                    if not c["site"]] == boundary
    # hidden, per step: 2 layers of 4 stream-sized collectives and 2 norms of B·S, the final norm and the output's
    # gather, forward; backward 4 stream-sized per layer, each norm's row sum and gain slices, the final norm's
    # included, and the input's gather
    assert totals["forward"]["elements"] == 2 * (4 * stream + 2 * rows) + rows + stream
    assert totals["backward"]["elements"] == 2 * 4 * stream + 5 * (rows + width) + stream
    code, out, _ = _run("plan", LLAMA, "--block", "LlamaModel", "--tp", "2", "--layout", "replicated",
                        "--dims", "B=2,S=8", "--dtype", "f32")
    assert "backward collectives, f32, per step:\n  layers.0:\n    all-reduce     at layers.0.self_attn" in out
    assert "  step        8 collectives,         8192 elements,        32768 B payload,        32768 B sent per rank" in out
