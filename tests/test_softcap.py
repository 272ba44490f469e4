"""softcap(x, cap=C): C * tanh(x / C), as Gemma 2 caps its logits; one op kind in one file."""
from __future__ import annotations

import pytest
import torch

import blockir
from blockir.analyses.diff import diff_blocks
from blockir.diagnostics import BlockError
from blockir.ir.printer import format_program

TEXT = """dim B: batch
dim S: seq
dim D: model = 8
block Capped(x: [B, S, D]) -> [B, S, D] {{
  norm: rmsnorm(D)
  attn: self_attention(heads=2)
  h = x + softcap(attn(norm(x)), {args})
  return h
}}
"""


def _program(args: str = "cap=2.5") -> blockir.Program:
    return blockir.parse(TEXT.format(args=args), "capped.block")


def test_it_prints_and_parses_back_to_the_same_program() -> None:
    program = _program()
    printed = format_program(program)
    assert "  %2 = softcap(%1, cap=2.5)" in printed
    assert blockir.parse(printed, "again.block") == program


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_it_computes_gemmas_softcap_bit_for_bit_with_its_gradient(backend: str) -> None:
    torch.manual_seed(0)
    m = blockir.compile(_program(), "Capped", backend=backend, dims={"B": 2, "S": 4})
    x = (10 * torch.randn(2, 4, 8)).requires_grad_()
    y, values = blockir.trace(m, x)
    branch = values["%1"].detach().requires_grad_()
    # Gemma 2's final-logit softcapping, in its order: divide, tanh, multiply
    expected = torch.tanh(branch / 2.5) * 2.5
    assert torch.equal(values["%2"], expected)
    assert float(values["%2"].detach().abs().max()) < 2.5
    g = torch.randn_like(expected)
    (grad,) = torch.autograd.grad(values["%2"], values["%1"], g, retain_graph=True)
    (ref,) = torch.autograd.grad(expected, branch, g)
    assert torch.equal(grad, ref)


def test_a_different_cap_is_a_different_function() -> None:
    a, b = _program("cap=2.5"), _program("cap=30")
    assert not diff_blocks(a, a.block("Capped"), b, b.block("Capped")).identical
    assert diff_blocks(a, a.block("Capped"), a, _program().block("Capped")).identical


@pytest.mark.parametrize("args, code, message, column", [
    ("cap=0", "E0120", "softcap's cap must be > 0, got 0", 11),
    ("cap=-1", "E0120", "softcap's cap must be > 0, got -1", 11),
    ("cup=2", "E0104", "unknown keyword argument 'cup' for 'softcap'", 34),
])
def test_a_wrong_argument_is_located(args: str, code: str, message: str, column: int) -> None:
    with pytest.raises(BlockError) as info:
        _program(args)
    d = info.value.diagnostics[0]
    assert (d.code, d.message, d.span.line, d.span.column) == (code, message, 7, column)


def test_a_missing_cap_names_the_keyword() -> None:
    with pytest.raises(BlockError) as info:
        blockir.parse(TEXT.format(args="").replace(", )", ")"), "capped.block")
    [d] = info.value.diagnostics
    assert (d.code, d.message, d.hint) == ("E0105", "'softcap' needs cap=…", "write softcap(x, cap=…)")


def test_the_name_is_reserved_and_suggested() -> None:
    with pytest.raises(BlockError) as info:
        blockir.parse(TEXT.format(args="cap=2").replace("softcap(", "softcaps("), "capped.block")
    [d] = info.value.diagnostics
    assert (d.code, d.hint) == ("E0101", "did you mean 'softcap'?")
