"""blockir diff: graphs compared by isomorphism; the same keys wired differently are another function."""
from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest

import blockir
from blockir.analyses.diff import diff_blocks
from blockir.cli import main
from blockir.ir.printer import format_program
from conftest import EXAMPLES

LAYER = """dim B: batch
dim S: seq
dim D: model = 64
dim F: hidden = 256
dim H: heads = 4

block Layer(x: [B, S, D]) -> [B, S, D] {{
  ln_1: layernorm(D{eps})
  attn: self_attention(heads=H)
  ln_2: layernorm(D)
  mlp: mlp(F)
{body}
  return y
}}
"""
PRE = "  h = x + attn(ln_1(x))\n  y = h + mlp(ln_2(h))"
POST = "  h = ln_1(x + attn(x))\n  y = ln_2(h + mlp(h))"


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _diff(a: str, b: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["diff", a, b])
    return code, out.getvalue()


def test_pre_ln_and_post_ln_with_the_same_keys(tmp_path: Path) -> None:
    a = _write(tmp_path, "pre.block", LAYER.format(eps="", body=PRE))
    b = _write(tmp_path, "post.block", LAYER.format(eps="", body=POST))
    code, text = _diff(a, b)
    assert code == 1
    assert text.splitlines()[-1] == "same parameter keys and shapes, different function"
    assert f"{a}:12:16: %0 = ln_1(x)" in text
    assert f"{b}:12:16: %0 = attn(x)" in text


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_a_file_and_its_printed_form_are_identical(path: Path, tmp_path: Path) -> None:
    printed = _write(tmp_path, "printed.block", format_program(blockir.parse(path.read_text(), str(path))))
    for block in blockir.parse(path.read_text()).blocks:
        out = io.StringIO()
        with redirect_stdout(out):
            assert main(["diff", str(path), printed, "--block", block.name]) == 0
        assert out.getvalue().rstrip().endswith("identical")


def test_renamed_values_and_reordered_lines_are_identical() -> None:
    a = blockir.parse(LAYER.format(eps="", body="  u = attn(ln_1(x))\n  h = x + u\n  y = h + mlp(ln_2(h))"))
    b = blockir.parse(LAYER.format(eps="", body="  v = ln_1(x)\n  w = attn(v)\n  h = x + w\n  y = h + mlp(ln_2(h))"))
    assert diff_blocks(a, a.blocks[0], b, b.blocks[0]).identical


def test_a_changed_eps_is_reported_with_both_declarations() -> None:
    a = blockir.parse(LAYER.format(eps="", body=PRE))
    b = blockir.parse(LAYER.format(eps=", eps=1e-6", body=PRE))
    d = diff_blocks(a, a.blocks[0], b, b.blocks[0])
    assert (d.identical, d.verdict) == (False, "same parameter keys and shapes, different function")
    assert d.first_a.decl == d.first_b.decl == "ln_1"


def test_different_keys() -> None:
    a = blockir.parse(LAYER.format(eps="", body=PRE))
    b = blockir.parse(LAYER.format(eps="", body=PRE).replace("ln_1: layernorm(D)", "ln_1: rmsnorm(D)"))
    d = diff_blocks(a, a.blocks[0], b, b.blocks[0])
    assert d.verdict == "different function and different parameter keys"
    assert d.key_changes == ("-ln_1.bias [64]",)


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    a = _write(tmp_path, "a.block", LAYER.format(eps="", body=PRE))
    assert main(["diff", a, a, "--block", "Nope"]) == 2
    assert main(["diff", a, str(tmp_path / "missing.block")]) == 2
