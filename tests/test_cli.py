"""The command line: formats, exit codes, the main job."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from blockir.cli import main
from conftest import ROOT

LLAMA = str(ROOT / "examples" / "llama.block")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_check_examples_clean() -> None:
    code, _, err = run_cli("check", *(str(p) for p in sorted((ROOT / "examples").glob("*.block"))))
    assert code == 0, err
    assert err.strip().endswith("15 files checked: 0 errors, 0 warnings")


def test_show_ir_is_the_golden() -> None:
    code, out, _ = run_cli("show", LLAMA)
    assert code == 0
    assert out == (ROOT / "tests" / "golden" / "ir" / "llama.ir").read_text()


def test_show_json_is_data() -> None:
    code, out, _ = run_cli("show", LLAMA, "--block", "LlamaDecoderLayer", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["class"] == "Block" and data["kind"] == "block" and data["name"] == "LlamaDecoderLayer"
    assert [op["class"] for op in data["ops"]] == ["InputOp", "NormOp", "CallOp", "AddOp", "NormOp", "CallOp", "AddOp",
                                                  "OutputOp"]


def test_show_dot_draws_the_residual_spine() -> None:
    code, out, _ = run_cli("show", LLAMA, "--block", "LlamaDecoderLayer", "--format", "dot")
    assert code == 0
    spine = [line.split()[0] for line in out.splitlines() if "group=spine" in line]
    assert spine == ['"x"', '"h"', '"y"']


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is installed by .ci/run")
def test_dot_renders_with_graphviz() -> None:
    dot = subprocess.run([sys.executable, "-m", "blockir", "show", LLAMA, "--format", "dot"], capture_output=True,
                         check=True, text=True).stdout
    svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, check=True, text=True).stdout
    assert "<svg" in svg and "self_attn" in svg


def test_unknown_block_is_usage_error() -> None:
    code, _, err = run_cli("show", LLAMA, "--block", "Nope")
    assert code == 2
    assert err.strip() == "blockir: no block named 'Nope' (blocks: LlamaDecoderLayer, LlamaModel)"


def test_usage_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as info, redirect_stderr(io.StringIO()):
        main(["check"])
    assert info.value.code == 2


def test_module_entry_point_and_version() -> None:
    out = subprocess.run([sys.executable, "-m", "blockir", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "blockir 0.1.0"


def test_run_prints_telemetry_table() -> None:
    code, out, _ = run_cli("run", LLAMA, "--steps", "2", "--dims", "B=2,S=8")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "run LlamaModel: inputs 2x8x64, 74048 parameters, 2 steps"
    assert lines[1].startswith("step 1/2  loss ")
    header = next(i for i, line in enumerate(lines) if line.startswith("site"))
    sites = [line.split()[0] for line in lines[header + 1: header + 5]]
    assert sites == ["layers.0.h", "layers.0.y", "layers.1.h", "layers.1.y"]
    rho_p50, rho_p90, rho_p99 = (float(v) for v in lines[header + 1].split()[1:4])
    assert 0 < rho_p50 <= rho_p90 <= rho_p99


def test_run_bad_dims_is_usage_error() -> None:
    code, _, err = run_cli("run", LLAMA, "--dims", "B=zero")
    assert code == 2
    assert "bad --dims entry 'B=zero'" in err


def test_run_binds_stand_ins_for_externs() -> None:
    code, out, _ = run_cli("run", str(ROOT / "examples" / "bert.block"), "--dims", "B=2,S=4")
    assert code == 0
    # Post-LN: the residual adds are the unnamed sums inside the two LayerNorm calls
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("site"))
    assert [line.split()[0] for line in lines[header + 1: header + 3]] == ["%2", "%6"]


def test_run_plot_writes_a_png(tmp_path) -> None:
    out = tmp_path / "telemetry.png"
    code, text, _ = run_cli("run", LLAMA, "--dims", "B=2,S=4", "--plot", str(out))
    assert code == 0 and text.rstrip().endswith(f"wrote {out}")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
