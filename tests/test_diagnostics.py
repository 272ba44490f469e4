"""Golden rendered diagnostics for malformed inputs: exact code, line, column, caret, message."""
from __future__ import annotations

import io
from contextlib import redirect_stderr
from pathlib import Path

import pytest

import blockir
from blockir.cli import main
from conftest import ROOT, check_golden

MALFORMED = sorted((ROOT / "tests" / "malformed").glob("*.block"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", MALFORMED, ids=lambda p: p.stem)
def test_malformed_golden(path: Path) -> None:
    with pytest.raises(blockir.BlockError) as info:
        blockir.parse(path.read_text(), _rel(path))
    check_golden(path.with_suffix(".expected"), str(info.value) + "\n")


@pytest.mark.parametrize("path", MALFORMED, ids=lambda p: p.stem)
def test_malformed_cli_exit_1_without_traceback(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["check", _rel(path)])
    assert code == 1
    assert "Traceback" not in err.getvalue()
    expected_code = path.read_text().split("expect: ")[1].split()[0]
    if expected_code.startswith("E"):
        assert f"error[{expected_code}]" in err.getvalue()


def test_first_line_of_each_fixture_names_its_code() -> None:
    assert len(MALFORMED) >= 25
    for path in MALFORMED:
        assert path.read_text().startswith("# expect: "), path


def test_diagnostic_fields() -> None:
    with pytest.raises(blockir.BlockError) as info:
        blockir.parse("dim D: model = 0\n", "f.block")
    (d,) = info.value.diagnostics
    assert (d.code, d.severity, d.span.filename, d.span.line, d.span.column) == ("E0108", "error", "f.block", 1, 16)
    assert d.message == "dim 'D' must be a positive integer, got 0"


def test_unreadable_file_exits_2(tmp_path: Path) -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["check", str(tmp_path / "missing.block")]) == 2
    assert "error[E0006]: cannot read file" in err.getvalue()


def test_binary_junk_is_a_diagnostic(tmp_path: Path) -> None:
    junk = tmp_path / "junk.block"
    junk.write_bytes(b"dim D: model = 8\n\xff\xfe\x00garbage")
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["check", str(junk)]) == 1
    assert f"{junk}:2:1: error[E0004]: file is not UTF-8 text (byte 0xff)" in err.getvalue()


def test_warnings_fail_only_with_werror(tmp_path: Path) -> None:
    f = tmp_path / "w.block"
    f.write_text("dim B: batch\ndim D: model = 8\nblock W(x: [B, D]) -> [B, D] {\n  unused: layernorm(D)\n  return x\n}\n")
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["check", str(f)]) == 0
        assert main(["check", "--werror", str(f)]) == 1
    assert "warning[W0103]: declaration 'unused' is never used" in err.getvalue()
