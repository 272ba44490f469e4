"""Mutated examples and failure-lab files never escape as a traceback.

Each case takes one file of examples/ or tests/failure_lab/ and applies one to
three token mutations: delete, duplicate or swap tokens; replace a number by
0, -1, 1e308, 1e309 or an integer of hundreds of digits; rename a name
(every use, or one) to a Python keyword, an nn.Module or fx attribute or
another name of the file; change a dim's role. ``blockir check`` must exit 0,
1 or 2 without a traceback, and a file that checks clean must compile at
small sizes and run one forward raising nothing but ``BlockError``.

CI runs a fixed set of cases (derandomized); ``BLOCKIR_FUZZ=N`` runs N fresh
random cases. A failure prints the mutated text. No exception is excused: a
name the lowering cannot use is reserved by ``check`` (E0102), every other
name compiles under its own key.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blockir
from blockir.analyses.sizes import program_env, value
from blockir.lifecycle.session import stand_ins
from blockir.cli import main
from blockir.diagnostics import BlockError
from blockir.ir.decls import InstanceDecl
from blockir.ir.types import DType
from conftest import ROOT

FILES = sorted((ROOT / "examples").glob("*.block")) + sorted((ROOT / "tests" / "failure_lab").glob("*.block"))
TEXTS = [p.read_text() for p in FILES]
TOKEN = re.compile(r"\s+|#[^\n]*|[A-Za-z_][A-Za-z0-9_]*|%[0-9]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                   r"|\*\*|->|.", re.S)
NUMBER = re.compile(r"[0-9.]")
IDENT = re.compile(r"[A-Za-z_]\w*")
NUMBERS = ["0", "-1", "1", "1e308", "1e309", "9" * 320, "2 ** 62", "0.5", "3"]
ODD_NAMES = ["forward", "training", "to", "cuda", "state_dict", "register_buffer", "code", "graph", "_modules",
             "__class__", "self", "import", "class", "None", "lambda", "def", "x.forward", "a.to"]
ROLES = ["batch", "seq", "model", "hidden", "heads", "head_dim"]
SMALL = {"batch": 2, "seq": 3, "model": 8, "hidden": 16, "heads": 2, "head_dim": 4}
MAX_FUZZ_LAYERS = 8  # depth is not what this test explores; deep stacks are covered by test_resources

RUNS = int(os.environ.get("BLOCKIR_FUZZ", "0"))
FUZZ = settings(max_examples=RUNS or 200, derandomize=not RUNS, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def _solid(toks: list[str]) -> list[int]:
    return [i for i, t in enumerate(toks) if not t.isspace() and not t.startswith("#")]


@st.composite
def mutant(draw) -> str:
    """A mutated file."""
    toks = tokens(TEXTS[draw(st.integers(0, len(TEXTS) - 1))])
    for _ in range(draw(st.integers(1, 3))):
        solid = _solid(toks)
        how = draw(st.sampled_from(["delete", "duplicate", "swap", "number", "name", "rename", "role"]))
        i = solid[draw(st.integers(0, len(solid) - 1))]
        if how == "delete":
            toks[i] = ""
        elif how == "duplicate":
            toks[i] = toks[i] + " " + toks[i]
        elif how == "swap":
            j = solid[draw(st.integers(0, len(solid) - 1))]
            toks[i], toks[j] = toks[j], toks[i]
        elif how == "number":
            numbers = [k for k in solid if NUMBER.match(toks[k])]
            if numbers:
                toks[draw(st.sampled_from(numbers))] = draw(st.sampled_from(NUMBERS))
        elif how in ("name", "rename"):
            names = sorted({toks[k] for k in solid if IDENT.fullmatch(toks[k])})
            old = draw(st.sampled_from(names))
            new = draw(st.sampled_from(ODD_NAMES + names))
            if how == "rename":
                toks = [new if t == old else t for t in toks]
            else:
                toks[draw(st.sampled_from([k for k in solid if toks[k] == old]))] = new
        else:
            roles = [k for k in solid if toks[k] in ROLES]
            if roles:
                toks[draw(st.sampled_from(roles))] = draw(st.sampled_from(ROLES))
    return "".join(toks)


def check(path: Path) -> int:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["check", str(path)])
    assert code in (0, 1, 2), err.getvalue()
    assert "Traceback" not in err.getvalue() + out.getvalue()
    return code


def compile_and_run(path: Path) -> None:
    """Compile the outermost block at small sizes and run one forward."""
    program = blockir.load(path)
    models = [b for b in program.blocks if b.kind == "model"] or list(program.blocks)
    block = models[-1]
    dims = {d.name: SMALL[d.role.value] for d in program.dims}
    env = program_env(program, dims)
    if any(isinstance(d, InstanceDecl) and (value(d.count, env) or 0) > MAX_FUZZ_LAYERS
           for b in program.blocks for d in b.decls):
        return
    module = blockir.compile(program, block.name, dims=dims, bind=stand_ins(program, block, dims), seed=0)
    dtypes = {DType.F64: torch.float64, DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}
    inputs = [torch.randn(*(dims[a.name] for a in p.type.axes), dtype=dtypes.get(p.type.dtype, torch.float32))
              for p in block.params]
    module(*inputs)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(text=mutant())
def test_mutated_files_check_and_compile_without_escaping(scratch: Path, text: str) -> None:
    path = scratch / "mutant.block"
    path.write_text(text)
    if check(path) != 0:
        return
    try:
        compile_and_run(path)
    except BlockError:
        pass
    except Exception as exc:  # noqa: BLE001  every other exception is an escape
        raise AssertionError(f"{type(exc).__name__}: {exc}\n--- mutated file ---\n{text}") from exc


@pytest.mark.parametrize("text", [
    TEXTS[0].replace("= 64", "= " + "9" * 320, 1),
    TEXTS[0].replace("(", "", 1),
    "const c = " + " + ".join(["1"] * 1000) + "\n",
    "dim D: model = 1e309\n",
    "\xff\xfe",
])
def test_check_in_a_subprocess_exits_without_a_traceback(tmp_path: Path, text: str) -> None:
    path = tmp_path / "case.block"
    path.write_text(text)
    done = subprocess.run([sys.executable, "-m", "blockir", "check", str(path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode in (0, 1, 2)
    assert "Traceback" not in done.stderr
    assert re.match(r".*:\d+:\d+: error\[E\d{4}\]", done.stderr) or done.returncode == 0, done.stderr
