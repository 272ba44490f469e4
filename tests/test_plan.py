"""`blockir plan` and the derived plan: placements equal a hand-written torchtitan-style plan, collective
counts equal the closed forms for Megatron tensor and sequence parallelism."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import blockir
from blockir.analyses.parallel import derive_plan
from blockir.analyses.sizes import Sizes
from blockir.cli import main
from blockir.commands.plan import CLOSED_FORM
from conftest import ROOT

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
        stream = 2 * 8 * 64
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
    """RMSNorm reduces Σx² per row, a written-out LayerNorm Σx and Σx²: the all-reduce carries that many elements
    per row. A LayerNorm run as one kernel gathers its row instead, in place of the gather at its branch."""
    rows = 2 * 8
    families = (ROOT / "tests" / "distributed" / "families.block").read_text()
    two_pass = families.replace("ln_1: layernorm(D, eps=1e-5, bias=true)", "ln_1: layernorm(D, eps=1e-5, bias=true, two_pass=true)")
    for prog, name, norm, expected in (
            (blockir.load(LLAMA), "LlamaModel", "layers.0.input_layernorm", [("all-reduce", rows)]),
            (blockir.parse(two_pass, "families.block"), "GPT2Model", "h.0.ln_1", [("all-reduce", 2 * rows)]),
            (blockir.parse(families, "families.block"), "GPT2Model", "h.0.ln_1", [])):
        plan = derive_plan(prog, prog.block(name), Sizes.of(prog, {"B": 2, "S": 8}), "hidden", 2)
        layer = norm.rsplit(".", 1)[0]
        assert [(c.op, c.elements) for c in plan.collectives[layer] if c.site == norm] == expected, norm
