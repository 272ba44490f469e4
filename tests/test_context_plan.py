"""The context layout's plan (no torch): weights replicated with pending-sum gradients, the stream split by rows
everywhere, each attention's keys and values all-gathered along the sequence (reduce-scattered in backward);
and the blocks it refuses, each at the declaration or block that cannot be split by rows."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from math import prod

import pytest

import blockir
from blockir.analyses.keys import param_keys
from blockir.analyses.parallel import derive_plan
from blockir.analyses.sizes import Sizes
from blockir.cli import main
from conftest import ROOT

LLAMA = str(ROOT / "examples" / "llama.block")
SUMMED = "replicate (gradient summed over tp)"


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _plan(text: str, name: str, dims: dict[str, int], world: int = 2):
    program = blockir.parse(text, "ctx.block")
    return derive_plan(program, program.block(name), Sizes.of(program, dims), "context", world)


def test_llamas_context_plan_gathers_keys_and_values_and_replicates_every_weight() -> None:
    code, out, _ = _run("plan", LLAMA, "--block", "LlamaModel", "--tp", "2", "--layout", "context",
                        "--dims", "B=2,S=8", "--dtype", "f32", "--format", "json")
    assert code == 0
    report = json.loads(out)
    keys = param_keys(blockir.load(LLAMA), "LlamaModel", {"B": 2, "S": 8}).keys
    assert report["params"] == {k.name: SUMMED for k in keys}
    assert report["stream"] == "shard(S)" and report["closed_form"] == {"all-gather": 2}
    assert report["modules"]["layers.0.self_attn"] == "context_attention"
    assert report["modules"]["layers.1.mlp"] == "rows" and report["modules"]["norm"] == "norm"
    # 2 key/value heads of 16 features: B·S·kv·hd = 2·8·2·16 elements, for the keys and for the values
    for phase, op in (("collectives", "all-gather"), ("backward", "reduce-scatter")):
        assert {layer: [(c["op"], c["site"], c["elements"], c["wire_bytes"]) for c in cs]
                for layer, cs in report[phase].items()} == \
            {f"layers.{i}": [(op, f"layers.{i}.self_attn", 512, 1024)] * 2 for i in range(2)} | \
            {"LlamaModel": [("all-gather", "", 1024, 2048)]}  # the whole output gathered, the input's gradient too
    assert report["totals"]["step"] == dict(collectives=10, elements=6144, bytes=24576, wire_bytes=12288)
    # every weight's gradient is a rank's summand: all of them are pending, reduced when read whole
    assert report["pending_gradient_elements"] == sum(prod(k.shape) for k in keys) == 74048


def test_the_text_plan_names_the_gathers_and_the_pending_gradients() -> None:
    code, out, _ = _run("plan", LLAMA, "--block", "LlamaModel", "--tp", "2", "--layout", "context",
                        "--dims", "B=2,S=8")
    assert code == 0
    assert out.startswith("model LlamaModel: tp=2, layout context, stream [B, S, D; tp=shard(S)] at every block "
                          "boundary\n")
    assert "forward collectives, bf16, per step:\n  layers.0:\n    all-gather     at layers.0.self_attn " \
           "                    1024 B payload,        512 B sent per rank\n" in out
    assert "backward collectives, bf16, per step:\n  layers.0:\n    reduce-scatter at layers.0.self_attn" in out
    assert "parameter gradients, pending sums over the ranks: 74048 elements, all-reduced when read whole " \
           "(an optimizer step), not listed above\n" in out


def test_grouped_and_broadcast_key_heads_size_the_gathers() -> None:
    """kv_heads sets the gathered width; keys broadcast to every query head right after the projection
    (kv_broadcast) are gathered as that many heads."""
    base = "dim B: batch\ndim S: seq\ndim D: model = 64\nblock L(x: [B, S, D]) -> [B, S, D] {{\n" \
           "  attn: self_attention(heads=4, {extra}causal=true)\n  h = x + attn(x)\n  return h\n}}\n"
    for extra, kv in (("", 4), ("kv_heads=1, ", 1), ("kv_heads=1, kv_broadcast=true, ", 4), ("head_dim=8, ", 4)):
        plan = _plan(base.format(extra=extra), "L", {"B": 3, "S": 4})
        width = 8 if "head_dim" in extra else 16
        assert [(c.op, c.elements) for c in plan.collectives[""] if c.site == "attn"] == \
            [("all-gather", 3 * 4 * kv * width)] * 2, extra


def test_every_example_is_placed_or_refused_at_its_branch() -> None:
    """Every block of every example places each of its keys under the context layout (a mixture of experts
    included: each rank routes its own rows), but for the two whose attention reads other rows than a rank's:
    cross-attention (the encoder's memory) and RealFormer's scores."""
    refused = {}
    for path in sorted((ROOT / "examples").glob("*.block")):
        program = blockir.load(path)
        for block in program.blocks:
            sizes = Sizes.of(program, {"B": 2, "S": 8})
            try:
                plan = derive_plan(program, block, sizes, "context", 2)
            except blockir.BlockError as exc:
                (d,) = exc.diagnostics
                refused[path.stem, block.name] = (d.code, d.span.line)
                continue
            assert set(plan.params) == {k.name for k in param_keys(program, block.name, {"B": 2, "S": 8}).keys}
    assert refused == {("encoder_decoder", "DecoderLayer"): ("E0631", 30), ("encoder_decoder", "Decoder"): ("E0631", 30),
                       ("realformer", "RealFormerLayer"): ("E0631", 13), ("realformer", "RealFormer"): ("E0631", 13)}


def _refusal(text: str, name: str, dims: dict[str, int]) -> tuple[str, int, str, str | None]:
    with pytest.raises(blockir.BlockError) as info:
        _plan(text, name, dims)
    (d,) = info.value.diagnostics
    return d.code, d.span.line, d.message, d.hint


HEADER = "dim B: batch\ndim S: seq\ndim D: model = 64\n"


def test_a_stream_without_a_sequence_axis_is_refused() -> None:
    text = "dim B: batch\ndim D: model = 64\ndim F: hidden = 128\nblock Rows(x: [B, D]) -> [B, D] {\n  mlp: mlp(F)\n" \
           "  h = x + mlp(x)\n  return h\n}\n"
    assert _refusal(text, "Rows", {"B": 2}) == (
        "E0630", 4, "block 'Rows' has no sequence axis in its stream [B, D] for the context layout to split",
        "context parallelism splits a [B, S, D] stream by its seq-role axis; declare one (dim S: seq), or use the "
        "replicated or hidden layout")


def test_a_sequence_the_ranks_cannot_split_evenly_is_refused() -> None:
    code, _, err = _run("plan", LLAMA, "--block", "LlamaModel", "--tp", "2", "--layout", "context", "--dims", "B=2,S=7")
    assert code != 0
    assert err.startswith(f"{LLAMA}:34:7: error[E0630]: the sequence axis S = 7 of model 'LlamaModel' does not "
                          "split into 2 equal slices of rows\n")
    assert "= hint: choose a sequence length that is a multiple of 2 (pad it), or fewer ranks" in err


def test_a_load_balanced_sequence_splits_into_two_chunks_per_rank() -> None:
    """Zig-zag: 2P equal chunks, rank r holding r and 2P - 1 - r; the gathers are the unbalanced plan's."""
    program = blockir.load(LLAMA)
    block, sizes = program.block("LlamaModel"), Sizes.of(program, {"B": 2, "S": 8})
    plan = derive_plan(program, block, sizes, "context", 2, balanced=True)
    assert plan.balanced and plan.collectives == derive_plan(program, block, sizes, "context", 2).collectives
    with pytest.raises(blockir.BlockError) as info:
        derive_plan(program, block, Sizes.of(program, {"B": 2, "S": 6}), "context", 2, balanced=True)
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.hint) == (
        "E0630", "the sequence axis S = 6 of model 'LlamaModel' does not split into 4 equal slices of rows",
        "choose a sequence length that is a multiple of 4 (pad it), or fewer ranks")


def test_cross_attention_and_score_residuals_are_refused_at_the_branch() -> None:
    program = blockir.load(ROOT / "examples" / "realformer.block")
    with pytest.raises(blockir.BlockError) as info:
        derive_plan(program, program.block("RealFormer"), Sizes.of(program, {"B": 2, "S": 8}), "context", 2)
    (d,) = info.value.diagnostics
    assert (d.code, d.span.line, d.message) == (
        "E0631", 13, "self_attention 'attn' carries its [B, H, S, S] scores to the next layer (score_residual), "
        "which the context layout does not split by the stream's rows")
    program = blockir.load(ROOT / "examples" / "encoder_decoder.block")
    with pytest.raises(blockir.BlockError) as info:
        derive_plan(program, program.block("Decoder"), Sizes.of(program, {"B": 2, "S": 8, "T": 8}), "context", 2)
    (d,) = info.value.diagnostics
    assert (d.code, d.span.line, d.message, d.hint) == (
        "E0631", 30, "cross_attention 'src_attn' attends to another sequence's keys, which the context layout does "
        "not split by the stream's rows", "parallelise this block with the sequence layout (the branch then sees "
        "full rows)")
