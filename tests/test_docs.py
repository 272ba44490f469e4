"""The reference documents stay true: their examples parse, their tables match
the schema, their rendered diagnostics and console sessions are what blockir
prints."""
from __future__ import annotations

import codecs
import io
import re
import shlex
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

import blockir
from blockir.cli import main
from blockir.diagnostics import BlockError, render
from blockir.ir.consts import Num, format_expr
from blockir.ir.kinds import KINDS, ArgSpec
from conftest import ROOT

DOCS = ROOT / "docs"
LANGUAGE = DOCS / "language.md"
DIAGNOSTICS = DOCS / "diagnostics.md"
SNIPPET = "example.block"  # the file name every diagnostics example is rendered under
# foundation codes: reading, parsing, names, arguments, types (the verifiers' codes are documented after them)
FOUNDATION = re.compile(r"[EW]0[01]\d\d")


@dataclass(frozen=True)
class Fence:
    lang: str
    info: str  # what follows the language on the opening line, e.g. a file name
    body: str
    line: int


def fences(text: str) -> list[Fence]:
    out = []
    for m in re.finditer(r"^```(\w*)[ \t]*([^\n]*)\n(.*?)^```[ \t]*$", text, re.M | re.S):
        out.append(Fence(m.group(1), m.group(2).strip(), m.group(3), text.count("\n", 0, m.start()) + 1))
    return out


def sections(text: str, level: str) -> dict[str, str]:
    """Heading's first word → the text up to the next heading of the same or a higher level."""
    out: dict[str, str] = {}
    key: str | None = None
    in_fence = False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and (m := re.match(r"(#+) (\S+)", line)) and len(m.group(1)) <= len(level):
            key = m.group(2).strip("`") if m.group(1) == level else None
            if key is not None:
                out[key] = ""
            continue
        if key is not None:
            out[key] += line
    return out


def run_console(session: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replay a ```console block: `printf … > FILE`, `blockir …` and `echo $?`; compare every output."""
    monkeypatch.chdir(cwd)
    code = 0
    steps = re.split(r"^\$ ", session, flags=re.M)[1:]
    for step in steps:
        command, _, expected = step.partition("\n")
        words = shlex.split(command)
        if words[0] == "printf":
            assert words[2] == ">", command
            (cwd / words[3]).write_bytes(codecs.escape_decode(words[1].encode())[0])
            actual = ""
        elif words[0] == "echo":
            assert words[1:] == ["$?"], command
            actual = f"{code}\n"
        else:
            assert words[0] == "blockir", command
            out = io.StringIO()
            with redirect_stdout(out), redirect_stderr(out):
                code = main(words[1:])
            actual = out.getvalue()
        assert actual.rstrip("\n") == expected.rstrip("\n"), f"$ {command}"


# --- language.md -------------------------------------------------------------------------
def test_every_block_snippet_of_the_language_reference_parses_and_verifies() -> None:
    snippets = [f for f in fences(LANGUAGE.read_text()) if f.lang == "block"]
    assert len(snippets) >= 8
    for f in snippets:
        program = blockir.parse(f.body, f"language.md:{f.line}")
        errors = [d for d in blockir.verify(program) if d.is_error or FOUNDATION.fullmatch(d.code)]
        assert not errors, f"snippet at line {f.line}: {errors}"


def _default_text(a: ArgSpec) -> str:
    if a.required:
        return "required"
    if a.default is None:
        return "unset"
    if isinstance(a.default, bool):
        return f"`{'true' if a.default else 'false'}`"
    if isinstance(a.default, Num):
        return f"`{format_expr(a.default)}`"
    return f"`{a.default}`"


def test_declaration_tables_match_the_kind_schema() -> None:
    kinds = sections(LANGUAGE.read_text(), "###")
    for spec in KINDS.values():
        assert spec.name in kinds, f"language.md has no section for {spec.name}"
        body = kinds[spec.name]
        assert f"Category: {spec.category}." in body, spec.name
        rows = [line.split("|")[1:-1] for line in body.splitlines() if line.startswith("| `")]
        assert [r[0].strip().strip("`") for r in rows] == [a.name for a in spec.args], spec.name
        for a, (_, kind, default, meaning) in zip(spec.args, rows):
            kind = kind.strip()
            assert kind.split(",")[0].split(":")[0] == a.kind, (spec.name, a.name)
            assert ("positional" in kind) == a.positional, (spec.name, a.name)
            assert all(f"`{c}`" in kind for c in a.choices), (spec.name, a.name)
            assert default.strip() == _default_text(a), (spec.name, a.name)
            assert meaning.strip(), (spec.name, a.name)


def test_console_sessions_of_the_language_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = fences(LANGUAGE.read_text())
    for f in blocks:
        if f.lang == "block" and f.info:
            (tmp_path / f.info).write_text(f.body)
    sessions = [f for f in blocks if f.lang == "console"]
    assert sessions
    for f in sessions:
        run_console(f.body, tmp_path, monkeypatch)


# --- diagnostics.md ----------------------------------------------------------------------
def _codes_in_source() -> set[str]:
    codes = set()
    for path in (ROOT / "blockir").rglob("*.py"):
        codes |= set(re.findall(r"""["']([EW]\d{4})["']""", path.read_text()))
    return {c for c in codes if FOUNDATION.fullmatch(c)}


def _entries() -> dict[str, str]:
    text = DIAGNOSTICS.read_text().split("<!-- verifier codes follow -->")[0]
    return sections(text, "##")


def test_every_foundation_code_emitted_by_the_source_is_documented() -> None:
    documented = {c for c in _entries() if FOUNDATION.fullmatch(c)}
    assert len(_codes_in_source()) >= 25
    assert _codes_in_source() <= documented, sorted(_codes_in_source() - documented)
    assert documented <= _codes_in_source(), f"documented but never emitted: {sorted(documented - _codes_in_source())}"


def test_verifier_codes_go_after_the_marker() -> None:
    assert DIAGNOSTICS.read_text().count("<!-- verifier codes follow -->") == 1


def _entry_cases() -> list[tuple[str, str]]:
    return sorted((code, body) for code, body in _entries().items() if FOUNDATION.fullmatch(code))


@pytest.mark.parametrize("code, body", _entry_cases(), ids=[c for c, _ in _entry_cases()])
def test_each_documented_code_is_produced_by_its_example_and_fixed_by_the_fix(
        code: str, body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = fences(body)
    if all(f.lang == "console" for f in blocks):
        # reading files: the examples are shell sessions
        assert len(blocks) == 2, code
        assert f"error[{code}]" in blocks[0].body
        for f in blocks:
            run_console(f.body, tmp_path, monkeypatch)
        return
    assert [f.lang for f in blocks] == ["block", "text", "block"], code
    wrong, shown, fixed = blocks
    try:
        program = blockir.parse(wrong.body, SNIPPET)
    except BlockError as exc:
        assert code in [d.code for d in exc.diagnostics]
        actual = str(exc)
    else:
        found = [d for d in blockir.verify(program) if d.code == code]
        assert found, f"the example of {code} does not produce it"
        actual = "\n".join(render(d, {SNIPPET: wrong.body}) for d in found)
    assert actual == shown.body.rstrip("\n"), f"{code}: the rendering shown differs from blockir's"
    program = blockir.parse(fixed.body, SNIPPET)
    left = [d for d in blockir.verify(program) if d.is_error or FOUNDATION.fullmatch(d.code)]
    assert not left, f"the fix of {code} still reports {left}"


def test_console_sessions_of_the_diagnostics_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = DIAGNOSTICS.read_text().split("\n## E0001")[0]
    sessions = [f for f in fences(head) if f.lang == "console"]
    assert sessions
    for f in sessions:
        run_console(f.body, tmp_path, monkeypatch)
