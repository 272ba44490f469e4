"""Every shipped example parses, verifies clean, prints to its reviewed golden IR and round-trips."""
from __future__ import annotations

from pathlib import Path

import pytest

import blockir
from blockir.ir.printer import format_program
from conftest import EXAMPLES, ROOT, check_golden

GOLDEN = ROOT / "tests" / "golden" / "ir"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_verifies_clean(path: Path) -> None:
    program = blockir.load(path)
    errors = [d for d in blockir.verify(program) if d.is_error]
    assert errors == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_golden_ir(path: Path) -> None:
    program = blockir.parse(path.read_text(), str(path))
    check_golden(GOLDEN / f"{path.stem}.ir", format_program(program))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_round_trips(path: Path) -> None:
    program = blockir.parse(path.read_text(), str(path))
    printed = format_program(program)
    again = blockir.parse(printed, "printed.block")
    assert again == program
    assert format_program(again) == printed


def test_every_example_has_a_header_naming_its_equation() -> None:
    for path in EXAMPLES:
        head = path.read_text().splitlines()[0]
        assert head.startswith("# "), path
