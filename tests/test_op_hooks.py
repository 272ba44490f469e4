"""Each op kind's lowering hooks: every kind fills the tables the backends and the ledger read, in its
own file and without torch, and a backend refuses a kind it has no hook for."""
from __future__ import annotations

import ast
import typing

import pytest

import blockir
from blockir import ops as O
from blockir.analyses.sizes import Sizes
from blockir.ir.hooks import COST, FUSED_LOWERING, FX_LOWERING
from blockir.lower.fx import lower_block
from blockir.lower.fused.lowering import FUSED
from blockir.passes.fuse import fuse_program
from conftest import ROOT

KINDS = list(typing.get_args(O.Op))
FUSED_ONLY = [O.FusedAddNormOp]  # made by the fusion pass for the fused backend alone

PROGRAM = """dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16
block L(x: [B, S, D]) -> [B, S, D] {
  f: mlp(F)
  ln: layernorm(D)
  h = ln(x + f(x))
  return h
}
"""


def test_every_kind_has_a_lowering_and_a_cost() -> None:
    assert FX_LOWERING.missing([k for k in KINDS if k not in FUSED_ONLY]) == []
    assert FUSED_LOWERING.missing(FUSED_ONLY) == []
    assert COST.missing(KINDS) == []


def test_each_hook_is_registered_by_its_kinds_own_file() -> None:
    wrong = [(table.name, kind.__name__, hook.__module__) for table in (FX_LOWERING, FUSED_LOWERING, COST)
             for kind, hook in table._by_kind.items() if hook.__module__ != kind.__module__]
    assert wrong == []


@pytest.mark.parametrize("path", sorted((ROOT / "blockir" / "ops").glob("*.py")), ids=lambda p: p.name)
def test_op_kinds_import_neither_torch_nor_a_later_stage(path) -> None:
    tree = ast.parse(path.read_text())
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    wrong = [m for m in modules if m.split(".")[0] == "torch"
             or any(m == f"blockir.{p}" or m.startswith(f"blockir.{p}.") for p in ("lower", "reports", "analyses"))]
    assert wrong == []


def test_the_fx_backend_refuses_a_fused_add_norm() -> None:
    program, _ = fuse_program(blockir.parse(PROGRAM, "l.block"))
    block = program.block("L")
    with pytest.raises(blockir.BlockError) as info:
        lower_block(program, block, Sizes.of(program), {})
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == ("E0705", "the fx backend cannot lower FusedAddNormOp")
    assert (d.span.filename, d.span.line, d.span.column) == ("l.block", 8, 10)  # the sum the op fused
    # the fused backend reads its own table first and lowers the same program
    m = lower_block(program, block, Sizes.of(program), {}, backend=FUSED)
    assert [n.target.__name__ for n in m.graph.nodes if n.op == "call_function"][1:2] == ["fused_boundary"]
