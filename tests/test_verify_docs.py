"""The verifier documentation stays true: every code is documented, its example renders as shown and its fix is
clean; the console sessions of docs/verifiers.md print what they show."""
from __future__ import annotations

import io
import re
import shlex
from contextlib import redirect_stderr, redirect_stdout

import pytest

import blockir
from blockir.cli import main
from blockir.diagnostics import render
from conftest import ROOT

DIAGNOSTICS = (ROOT / "docs" / "diagnostics.md").read_text().split("<!-- verifier codes follow -->")[-1]
VERIFIERS = (ROOT / "docs" / "verifiers.md").read_text()
VERIFIER_CODE = re.compile(r"[EW]0[2-6]\d\d")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def _sections() -> dict[str, str]:
    parts = re.split(r"^## ", DIAGNOSTICS, flags=re.M)[1:]
    return {p.split()[0]: p for p in parts}


def _emitted() -> set[str]:
    codes: set[str] = set()
    # the norm verifier runs each family's own contract checks, which live in the family's file
    for path in [*(ROOT / "blockir" / "verifiers").glob("*.py"), *(ROOT / "blockir" / "norms").glob("*.py")]:
        codes |= set(re.findall(r"""["']([EW]\d{4})["']""", path.read_text()))
    return {c for c in codes if VERIFIER_CODE.fullmatch(c)}


def test_every_verifier_code_is_documented_once() -> None:
    assert set(_sections()) == _emitted()


CASES = sorted((code, body) for code, body in _sections().items() if FENCE.search(body))


@pytest.mark.parametrize("code, body", CASES, ids=[c for c, _ in CASES])
def test_example_renders_as_shown_and_the_fix_is_clean(code: str, body: str) -> None:
    (_, wrong), (_, shown), (_, fixed) = FENCE.findall(body)
    found = blockir.verify(blockir.parse(wrong, "example.block"))
    assert {d.code for d in found} == {code}
    assert "\n".join(render(d, {"example.block": wrong}) for d in found) == shown.rstrip("\n")
    assert blockir.verify(blockir.parse(fixed, "example.block")) == []


def _sessions() -> list[tuple[str, str]]:
    out = []
    for lang, body in FENCE.findall(VERIFIERS):
        if lang != "console":
            continue
        for chunk in body.split("$ ")[1:]:
            command, _, shown = chunk.partition("\n")
            out.append((command, shown))
    return out


@pytest.mark.parametrize("command, shown", [s for s in _sessions() if "examples/" in s[0]], ids=lambda v: v[:40])
def test_console_sessions_on_examples(command: str, shown: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        assert main(shlex.split(command)[1:]) == 0
    lines = [line for line in shown.splitlines() if line.strip() != "..."]
    # an elided session ("...") shows a prefix of the output
    assert out.getvalue().splitlines()[:len(lines)] == lines
