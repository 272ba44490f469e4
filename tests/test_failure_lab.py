"""Failure lab: one fixture per bug in a block's scope, with reviewed golden diagnostics.

Each fixture starts with ``# expect: CODE at LINE:COL`` lines naming every
diagnostic it must produce, in order; its ``.expected`` file holds the exact
rendered text. Update goldens with BLOCKIR_UPDATE_GOLDENS=1 and review them.
"""
from __future__ import annotations

import dataclasses
import io
import re
from contextlib import redirect_stderr
from pathlib import Path

import pytest

import blockir
from blockir.cli import main
from blockir.diagnostics import render_all
from blockir.ops import CallOp, FusedAddNormOp
from blockir.ir.program import Program
from conftest import ROOT, check_golden

LAB = ROOT / "tests" / "failure_lab"
FIXTURES = sorted(LAB.glob("*.block"))
REQUIRED = {*range(1, 9), *range(11, 22), *range(23, 27), 32, 33, 35, 36, 37, 38, 41, 44, 45, 46, 47, 48, 50, 52, 61, 62}
EXPECT = re.compile(r"^# expect: ([EW]\d{4}) at (\d+):(\d+)$")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _expected(path: Path) -> list[tuple[str, int, int]]:
    out = []
    for line in path.read_text().splitlines():
        m = EXPECT.match(line)
        if m:
            out.append((m[1], int(m[2]), int(m[3])))
    return out


def _verify(path: Path) -> tuple[list[blockir.Diagnostic], str]:
    text = path.read_text()
    diags = blockir.verify(blockir.parse(text, _rel(path)))
    return diags, render_all(diags, {_rel(path): text}) + "\n"


def test_every_required_bug_has_a_fixture() -> None:
    numbers = {int(p.name.split("_")[0]) for p in FIXTURES}
    assert REQUIRED <= numbers, sorted(REQUIRED - numbers)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_names_its_diagnostics(path: Path) -> None:
    expected = _expected(path)
    assert expected, f"{path.name} has no '# expect:' line"
    diags, _ = _verify(path)
    assert [(d.code, d.span.line, d.span.column) for d in diags] == expected


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_golden(path: Path) -> None:
    _, rendered = _verify(path)
    check_golden(path.with_suffix(".expected"), rendered)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_check_exits_1_without_traceback(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    # a fixture whose every finding is a warning fails only under --werror
    werror = all(code.startswith("W") for code, _, _ in _expected(path))
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["check", *(["--werror"] if werror else []), _rel(path)])
    assert code == 1
    assert "Traceback" not in err.getvalue()
    for expected_code, line, column in _expected(path):
        assert f"{_rel(path)}:{line}:{column}: " in err.getvalue()
        assert f"[{expected_code}]" in err.getvalue()


def _swap_fused_outputs(program: Program) -> Program:
    """Bug 37 after fusion: the add+norm's outputs taken in the wrong order.

    ``h = x + attn(…); n = norm(h)`` becomes one fused op returning
    (normalized=n, residual=h); the MLP then reads the residual and the next
    add reads the normalized output as if it were the stream.
    """
    block = program.block("NormalizedResidual")
    add, norm = block.producers["h"], block.producers["n"]
    fused = FusedAddNormOp("n", "h", norm.type, add.type, norm.decl, branch=add.rhs, shortcut=add.lhs, span=add.span)
    ops = []
    for op in block.ops:
        if op is add:
            ops.append(fused)
        elif op is norm:
            continue
        elif isinstance(op, CallOp) and op.args == ("n",):
            ops.append(dataclasses.replace(op, args=("h",)))
        else:
            ops.append(op)
    return dataclasses.replace(program, blocks=(dataclasses.replace(block, ops=tuple(ops)),))


def test_fused_form_of_bug_37() -> None:
    path = LAB / "37_normalized_as_residual.block"
    text = path.read_text()
    program = _swap_fused_outputs(blockir.parse(text, _rel(path)))
    diags = blockir.verify(program)
    assert [d.code for d in diags] == ["E0412"]
    check_golden(LAB / "37_normalized_as_residual.fused.expected", render_all(diags, {_rel(path): text}) + "\n")
