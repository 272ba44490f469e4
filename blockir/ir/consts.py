"""Constant expressions (`4 * D`, `(2 * num_layers) ** 0.25`) and a safe evaluator.

Expressions are data, never Python source: evaluation walks the tree with
explicit bounds on exponents and magnitudes, so no input can run code or
allocate without limit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Union

from blockir.diagnostics import Span, UNKNOWN_SPAN

MAX_MAGNITUDE = 1e300
MAX_INT = 1 << 62


@dataclass(frozen=True)
class Num:
    """A number."""

    value: int | float
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Name:
    """A dim, constant or layer variable, by name."""

    name: str
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Bin:
    """A binary arithmetic expression."""

    op: str
    left: "ConstExpr"
    right: "ConstExpr"
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Neg:
    """A unary minus."""

    operand: "ConstExpr"
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)


ConstExpr = Union[Num, Name, Bin, Neg]
EXPRS = (Num, Name, Bin, Neg)  # for isinstance: an argument value that is a constant expression

# names every constant expression may use; bound per layer when a block is stacked
LAYER = "layer"
NUM_LAYERS = "num_layers"
LAYER_NAMES = (LAYER, NUM_LAYERS)


class ConstError(Exception):
    def __init__(self, message: str, span: Span):
        super().__init__(message)
        self.message = message
        self.span = span


def names_in(expr: ConstExpr) -> set[str]:
    stack, out = [expr], set()
    while stack:
        e = stack.pop()
        if isinstance(e, Name):
            out.add(e.name)
        elif isinstance(e, Bin):
            stack += [e.left, e.right]
        elif isinstance(e, Neg):
            stack.append(e.operand)
    return out


def describe(value: int) -> str:
    """A short text for an integer of any size: formatting a huge int as a float would overflow, and
    converting one with thousands of digits to decimal text is refused by Python."""
    if abs(value) < 10**300:
        return f"{value:.3g}"
    digits = int(value.bit_length() * math.log10(2)) + 1  # exact or one too many
    if abs(value) < 10 ** (digits - 1):
        digits -= 1
    return f"of {digits} digits"


def _check(value: float | int, span: Span) -> float | int:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value) or abs(value) > MAX_MAGNITUDE):
        raise ConstError("constant is not a finite number", span)
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise ConstError(f"constant {describe(value)} is too large (the limit is 2**62)", span)
    return value


def _pow(a: float | int, b: float | int, span: Span) -> float | int:
    if a == 0 and b < 0:
        raise ConstError("zero raised to a negative power", span)
    if a < 0 and not float(b).is_integer():
        raise ConstError("negative base with a fractional exponent", span)
    if abs(b) > 1024 and abs(a) not in (0, 1):
        raise ConstError("exponent is too large", span)
    if isinstance(a, int) and isinstance(b, int) and b >= 0:
        if a not in (0, 1, -1) and b * math.log2(abs(a)) > 62:
            raise ConstError("constant is too large", span)
        return a**b
    try:
        return float(a) ** float(b)
    except OverflowError:
        raise ConstError("constant is too large", span) from None


def evaluate(expr: ConstExpr, env: Mapping[str, float | int]) -> float | int:
    """Evaluate with names from env; raise ConstError with the span of the offending node."""
    if isinstance(expr, Num):
        return _check(expr.value, expr.span)
    if isinstance(expr, Name):
        if expr.name not in env:
            raise ConstError(f"'{expr.name}' has no value here", expr.span)
        return env[expr.name]
    if isinstance(expr, Neg):
        return -evaluate(expr.operand, env)
    a = evaluate(expr.left, env)
    b = evaluate(expr.right, env)
    if expr.op == "+":
        r = a + b
    elif expr.op == "-":
        r = a - b
    elif expr.op == "*":
        r = a * b
    elif expr.op == "/":
        if b == 0:
            raise ConstError("division by zero", expr.span)
        r = a // b if isinstance(a, int) and isinstance(b, int) and a % b == 0 else a / b
    elif expr.op in ("//", "%"):  # floored, as Python's: the remainder takes the divisor's sign
        if b == 0:
            raise ConstError("division by zero", expr.span)
        r = a // b if expr.op == "//" else a % b
    else:
        r = _pow(a, b, expr.span)
    return _check(r, expr.span)


PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2, "%": 2, "**": 3}


def format_expr(expr: ConstExpr, parent: int = 0, right: bool = False) -> str:
    """Print with the fewest parentheses that keep the tree when parsed again."""
    if isinstance(expr, Num):
        return repr(expr.value)
    if isinstance(expr, Name):
        return expr.name
    if isinstance(expr, Neg):
        inner = format_expr(expr.operand, 4)
        return f"-{inner}" if parent < 3 else f"(-{inner})"
    prec = PRECEDENCE[expr.op]
    if expr.op == "**":  # right-associative
        text = f"{format_expr(expr.left, prec + 1)} ** {format_expr(expr.right, prec)}"
    else:
        text = f"{format_expr(expr.left, prec)} {expr.op} {format_expr(expr.right, prec, right=True)}"
    needs = prec < parent or (right and prec == parent and expr.op != "**")
    return f"({text})" if needs else text
