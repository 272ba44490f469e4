"""Whole-program resources: inputs near the limits answer with a result or a diagnostic, and a stack's
analyses do not grow with its depth (checked by exact arithmetic, never by timing)."""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

import blockir
from blockir.reports.budget import MAX_LAYERS_COMPILED
from blockir.reports.cost import ledger
from blockir.cli import main
from blockir.diagnostics import BlockError

LAYER = """dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 4 * D
block Layer(x: [B, S, D]) -> [B, S, D] {{
  ln_1: layernorm(D)
  attn: self_attention(heads=2)
  ln_2: layernorm(D)
  mlp: mlp(F)
  h = x + {branch}
  y = h + mlp(ln_2(h))
  return y
}}
model Model(x: [B, S, D]) -> [B, S, D] {{
  layers: Layer * {n}
  norm: layernorm(D)
  return norm(layers(x))
}}
"""
PLAIN = "attn(ln_1(x))"
STOCHASTIC = "drop_path(attn(ln_1(x)), p=0.1 * layer / num_layers)"


def stack(n: int, branch: str = PLAIN) -> blockir.Program:
    return blockir.parse(LAYER.format(n=n, branch=branch), "stack.block")


def totals(n: int, branch: str = PLAIN) -> tuple[int, ...]:
    led = ledger(stack(n, branch), "Model", {"B": 2, "S": 8})
    t = led.total
    return (led.blocks[0].instances, t.unfused.adds, t.unfused.bytes_moved, t.unfused.saved_bytes,
            t.fused.bytes_moved, t.fused.saved_bytes, t.fused.reductions_forward)


def test_a_deep_stack_costs_its_layers_times_one_layer() -> None:
    one, two = totals(1), totals(2)
    expected = tuple(a + (100_000 - 1) * (b - a) for a, b in zip(one, two))
    assert totals(100_000) == expected


@pytest.mark.parametrize("branch", [PLAIN, STOCHASTIC])
def test_the_ledger_of_a_stack_equals_the_ledger_of_its_layers_written_out(branch: str) -> None:
    # five layers: deep enough for the repeating pattern, small enough to inline in full as well
    from blockir.analyses.sizes import program_env
    from blockir.ir.types import DType
    from blockir.reports.cost import walk
    program = stack(5, branch)
    base = program_env(program, {"B": 2, "S": 8})
    extrapolated = walk._inlined_tally(program, "Model", base, DType.BF16)
    assert extrapolated == walk._inlined_walk(program, "Model", base, DType.BF16, {})
    assert totals(5, branch)[0] == 5


def test_stochastic_depth_counts_the_layer_without_dropout_apart() -> None:
    plain, stochastic = totals(8), totals(8, STOCHASTIC)
    assert stochastic[2] > plain[2]  # seven layers draw a mask; layer 0 (p = 0) moves what PLAIN moves


def test_a_long_constant_sum_is_rejected_where_it_gets_too_deep() -> None:
    text = "const c = " + " + ".join(["1"] * 100_000) + "\n"
    with pytest.raises(BlockError) as info:
        blockir.parse(text, "sum.block")
    [d] = info.value.diagnostics
    assert (d.code, d.message, d.span.line, d.span.column) == (
        "E0005", "expression nests deeper than 256 operations", 1, 11)


def test_compile_refuses_more_layers_than_it_can_build() -> None:
    with pytest.raises(BlockError) as info:
        blockir.compile(stack(100_000), "Model", dims={"B": 1, "S": 2})
    [d] = info.value.diagnostics
    assert (d.code, d.message) == (
        "E0706", f"compiling 'Model' would build 100,000 layer modules; the limit is {MAX_LAYERS_COMPILED:,}")


def test_compile_refuses_activations_beyond_the_budget() -> None:
    with pytest.raises(BlockError) as info:
        blockir.compile(stack(4), "Model", dims={"B": 4096, "S": 65536})
    [d] = info.value.diagnostics
    assert d.code == "E0706" and d.message.startswith("training 'Model' at these sizes would keep at least ")


def test_run_on_a_deep_stack_is_a_located_diagnostic(tmp_path) -> None:
    path = tmp_path / "deep.block"
    path.write_text(LAYER.format(n=100_000, branch=PLAIN))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["run", str(path)])
    assert code == 1
    assert err.getvalue().startswith(f"{path}:15:3: error[E0706]: compiling 'Model' would build 100,000 layer")
