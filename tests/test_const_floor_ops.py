"""Integer `%` and `//` in constant expressions: values, bounds, the printer, and a period in `layer`."""
from __future__ import annotations

import pytest

import blockir
from blockir.ir.consts import evaluate
from blockir.ir.printer import format_program

HEAD = "dim B: batch\ndim S: seq\ndim D: model = 8\n"


def _consts(body: str) -> dict[str, float]:
    program = blockir.parse(HEAD + body)
    return {c.name: evaluate(c.value, {"D": 8}) for c in program.consts}


@pytest.mark.parametrize("expr, value", [
    ("17 % 6", 5), ("17 // 6", 2), ("-7 // 2", -4), ("-7 % 3", 2), ("7 % -3", -2), ("7.5 // 2", 3.0),
    ("2 * 7 % 4", 2), ("2 * (7 % 4)", 6), ("10 - 9 // 2 * 2", 2), ("2 ** 3 % 5", 3), ("-5 % 3", 1),
    ("(D + 1) % 6", 3),
])
def test_floor_division_and_remainder_follow_python(expr: str, value: float) -> None:
    got = _consts(f"const c = {expr}\n")["c"]
    assert got == value and type(got) is type(value)


def test_division_by_zero_is_located() -> None:
    with pytest.raises(blockir.BlockError) as info:
        blockir.parse(HEAD + "const c = 5 % (D - 8)\n", "zero.block")
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.span.line, d.span.column) == ("E0113", "division by zero", 4, 11)


def test_a_tensor_has_no_remainder() -> None:
    text = HEAD + "block A(x: [B, S, D]) -> [B, S, D] {\n  return x % 2\n}\n"
    with pytest.raises(blockir.BlockError) as info:
        blockir.parse(text, "t.block")
    assert [(d.code, d.message) for d in info.value.diagnostics] == [("E0111", "'%' does not apply to tensors")]


PERIODIC = HEAD + """const L = 7
block Layer(x: [B, S, D]) -> [B, S, D] {
  const sliding = ((layer + 1) % 3 + 2) // 3
  attn: self_attention(heads=2, rope=true, rope_theta=1000 - 900 * sliding, window=4 * sliding)
  return x + attn(x)
}
model M(x: [B, S, D]) -> [B, S, D] {
  layers: Layer * L
  return layers(x)
}
"""


def test_a_period_in_layer_sets_per_layer_options_and_round_trips() -> None:
    program = blockir.parse(PERIODIC)
    printed = format_program(program)
    assert "const sliding = ((layer + 1) % 3 + 2) // 3" in printed
    assert blockir.parse(printed) == program
    model = blockir.compile(program, "M", seed=0)
    assert [layer.attn.core.window for layer in model.layers] == [4, 4, None, 4, 4, None, 4]
    assert [layer.attn.rope_theta for layer in model.layers] == [100.0, 100.0, 1000.0, 100.0, 100.0, 1000.0, 100.0]
