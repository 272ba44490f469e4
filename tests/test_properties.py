"""Property tests.

Random *valid* programs (every declaration kind, every operation, random
layout) must parse, type every value as the generator predicted, print to
text that parses back to the same IR, and verify without crashing. Random
text, random bytes and mutations of the shipped examples must only ever
produce diagnostics with valid spans, never another exception.
"""
from __future__ import annotations

import io
import math
import random
import re
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blockir
from blockir.cli import main
from blockir.diagnostics import BlockError, Diagnostic, render
from blockir.frontend.parser import decode
from blockir.ir import consts as C
from blockir.ir.identifiers import reserved_declaration
from blockir.ir.kinds import ACTIVATIONS, FUNCTIONS, GATES, KINDS, MASKS, ArgSpec
from blockir.ops import OutputOp
from blockir.ir.printer import format_program
from blockir.ir.program import Program
from blockir.ir.types import DType, TensorType
from conftest import EXAMPLES

# Deterministic runs: CI must see the same cases every time, and a slow shared
# runner must not turn a fast test into a deadline failure.
BASE = settings(derandomize=True, database=None, deadline=None, print_blob=False)

X = TypeVar("X")
DTYPES = ("f64", "f32", "f16", "bf16")
KEYWORDS = ("return", "const", "dim", "extern", "true", "false")
# names the language reserves: keywords, the layer names, built-in functions and dtypes
RESERVED = frozenset(KEYWORDS + C.LAYER_NAMES + FUNCTIONS + tuple(d.value for d in DType))
# Legal names that look like something else (dtypes, kinds, functions, roles,
# float spellings): the lexer, the builder and the printer must keep them apart.
LOOKALIKES = ("f32", "bf16", "f16", "f64", "gelu", "relu", "dropout", "drop_path", "layer_drop", "cast", "concat", "mlp",
              "linear", "scalar", "layernorm", "model", "block", "seq", "batch", "hidden", "inf", "nan", "e5", "x",
              "y", "_", "_0", "returns", "constant", "dims", "layers", "extern_", "true_")
NAME_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
NAME_REST = NAME_START + "0123456789"
# (layer, num_layers) pairs a stacked block may see: block constants and drop
# probabilities must be valid for every layer of a stack, not only the first.
LAYER_ENVS = ((0, 1), (0, 2), (1, 2), (0, 12), (11, 12), (63, 64))


class R:
    """The fine-grained choices of one generated program.

    Hypothesis draws the seed and the size knobs (which shrink well); a seeded
    generator makes the hundreds of small choices, which as Hypothesis draws
    would cost most of the test's time and overrun its buffer.
    """

    def __init__(self, seed: int, fancy: bool):
        self.rng = random.Random(seed)
        self.fancy = fancy  # odd spacing, comments, spare parentheses and trailing commas

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def coin(self, p: float = 0.5) -> bool:
        return self.rng.random() < p

    def pick(self, seq: Sequence[X]) -> X:
        return seq[self.rng.randrange(len(seq))]

    def shuffled(self, seq: Sequence[X]) -> list[X]:
        out = list(seq)
        self.rng.shuffle(out)
        return out

    def odd(self, plain: str, *variants: str) -> str:
        """plain, or when the program is fancy, sometimes one of variants."""
        return self.pick(variants) if self.fancy and self.coin(0.3) else plain

    def name(self) -> str:
        if self.coin(0.25):
            text = self.pick(LOOKALIKES)
        else:
            text = self.pick(NAME_START) + "".join(self.pick(NAME_REST) for _ in range(self.int(0, 7)))
        # a declaration may not take a name that cannot be a submodule (forward, to, a keyword…)
        if text in RESERVED or reserved_declaration(text):
            text += "_"
        return text + "0" if reserved_declaration(text) else text  # __x__ + _ is still special

    def comment(self) -> str:
        chars = [chr(self.int(0x20, 0x2FFFF)) for _ in range(self.int(0, 10))]
        return "# " + "".join(c for c in chars if not 0xD800 <= ord(c) <= 0xDFFF)

    def sep(self) -> str:
        """Between statements: newlines are insignificant, comments run to the end of the line."""
        return self.odd("\n", "\n\n", " ", "\t", "\r\n", f"  {self.comment()}\n", "\n\n\n  ")


def fresh(r: R, taken: set[str], name: str | None = None) -> str:
    name = name or r.name()
    while name in taken:
        name += "_"
    taken.add(name)
    return name


# --- constant expressions ------------------------------------------------------
# arguments that change what a call takes and returns (a score-carrying attention returns two values);
# tests/test_nested_properties.py generates those calls
SIGNATURE_ARGS = ("score_residual",)


class Invalid(Exception):
    """A generated constant that would not evaluate, or would leave the generator's bounds."""


@dataclass(frozen=True)
class K:
    """A generated constant expression: op is num, name, neg or a binary operator."""

    op: str
    args: tuple["K", ...] = ()
    text: str = ""
    value: int | float = 0


LIMIT = 1e6
PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def kval(t: K, env: dict[str, Any]) -> int | float:
    """Evaluate with the semantics the language documents (exact integer division stays integral)."""
    if t.op == "num":
        v = t.value
    elif t.op == "name":
        v = env[t.text]
    elif t.op == "neg":
        v = -kval(t.args[0], env)
    else:
        a, b = kval(t.args[0], env), kval(t.args[1], env)
        if t.op == "+":
            v = a + b
        elif t.op == "-":
            v = a - b
        elif t.op == "*":
            v = a * b
        elif t.op == "/":
            if b == 0:
                raise Invalid
            v = a // b if isinstance(a, int) and isinstance(b, int) and a % b == 0 else a / b
        else:
            if (a == 0 and b < 0) or (a < 0 and not float(b).is_integer()) or abs(b) > 8:
                raise Invalid
            v = a**b if isinstance(a, int) and isinstance(b, int) and b >= 0 else float(a) ** float(b)
    if not math.isfinite(v) or abs(v) > LIMIT:
        raise Invalid
    return v


def number(text: str) -> K:
    return K("num", text=text, value=int(text) if text.isdigit() else float(text))


def literal(r: R, integer: bool | None = None, lo: int = 0, hi: int = 64) -> K:
    if integer if integer is not None else r.coin():
        n = r.int(lo, hi)
        return number(r.odd(str(n), f"0{n}"))
    x = r.pick([0.5, 0.25, 0.1, 1e-5, 1e-6, 1e-12, 2.0, 10000.0, 0.0, 1.0]) if r.coin() else r.rng.uniform(0, 100)
    forms = [repr(x), f"{x:.3e}", f"{x:.4E}"] + ([repr(x)[1:]] if repr(x).startswith("0.") else [])  # '.5'
    return number(r.pick(forms))


def kexpr(r: R, names: Sequence[str], depth: int = 3) -> K:
    choice = r.int(0, 9) if depth > 0 else 0
    if choice <= 3:
        return K("name", text=r.pick(names)) if names and r.coin() else literal(r)
    if choice == 4:
        return K("neg", (kexpr(r, names, depth - 1),))
    if choice == 9:
        exponent = r.pick([number(str(r.int(0, 3))), number("0.5"), number("0.25"), K("neg", (number("1"),))])
        return K("**", (kexpr(r, names, depth - 1), exponent))
    return K(r.pick("+-*/"), (kexpr(r, names, depth - 1), kexpr(r, names, depth - 1)))


def ktext(r: R, t: K) -> tuple[str, int]:
    """Print with the fewest parentheses the grammar needs (plus spare ones); returns (text, precedence)."""
    sp = r.odd(" ", "", "  ")
    if t.op in ("num", "name"):
        text, prec = t.text, 5
    elif t.op == "neg":
        inner, p = ktext(r, t.args[0])
        text, prec = "-" + (inner if p >= 3 else f"({inner})"), 3
    elif t.op == "**":
        (left, lp), (right, rp) = ktext(r, t.args[0]), ktext(r, t.args[1])
        left = left if lp == 5 else f"({left})"  # the base is an atom
        right = right if rp >= 3 else f"({right})"  # the exponent is a unary
        text, prec = f"{left}{sp}**{sp}{right}", 4
    else:
        q = PREC[t.op]
        (left, lp), (right, rp) = ktext(r, t.args[0]), ktext(r, t.args[1])
        left = left if lp >= q else f"({left})"
        right = right if rp > q else f"({right})"  # left-associative
        text, prec = f"{left}{sp}{t.op}{sp}{right}", q
    if r.fancy and r.coin(0.08):
        return f"({text})", 5
    return text, prec


def constant(r: R, names: Sequence[str], envs: Sequence[dict[str, Any]], ok: Callable[[Any], bool],
             fallback: Callable[[], K]) -> tuple[K, str, int]:
    """A constant expression valid in every env, else a fallback literal: (tree, text, precedence)."""
    t = kexpr(r, names, r.int(0, 3))
    try:
        valid = all(ok(kval(t, env)) for env in envs)
    except Invalid:
        valid = False
    if not valid:
        t = fallback()
    return (t, *ktext(r, t))


def positive_int(limit: int) -> Callable[[Any], bool]:
    return lambda v: float(v).is_integer() and 1 <= v <= limit


def any_value(v: Any) -> bool:
    return True


# --- tensor types ----------------------------------------------------------------
@dataclass(frozen=True)
class T:
    axes: tuple[str, ...]
    dtype: str | None

    @property
    def last(self) -> str:
        return self.axes[-1]

    @property
    def rows(self) -> tuple[str, ...]:
        return self.axes[:-1]

    @property
    def joined(self) -> bool:
        """The result type of a concat: its last axis is no declared dim."""
        return "+" in self.last

    def with_last(self, last: str) -> "T":
        return T(self.rows + (last,), self.dtype)

    def with_dtype(self, dtype: str | None) -> "T":
        return T(self.axes, dtype)


def type_text(r: R, t: T) -> str:
    sp = r.odd("", " ")
    comma = r.odd(", ", ",", " , ", ",\n  ")
    body = "[" + sp + comma.join(t.axes) + r.odd("", ",") + sp + "]"
    return body + (" " + t.dtype if t.dtype else "")


# --- programs --------------------------------------------------------------------
@dataclass
class Knobs:
    """The sizes Hypothesis draws and shrinks; everything else follows from the seed."""

    seed: int
    fancy: bool
    blocks: int
    equations: int
    depth: int


@dataclass
class BlockInfo:
    name: str
    params: tuple[T, ...]
    result: T
    carried: T | None = None  # a second result, threaded into the second input by a stack


@dataclass
class Generated:
    """A program's text and what the generator knows it must mean."""

    text: str
    file_env: dict[str, int | float]
    values: dict[str, dict[str, T]] = field(default_factory=dict)  # block -> value -> type
    results: dict[str, T] = field(default_factory=dict)


# precedence of a sum that is not a residual add ('x + b', '1 - z'): parenthesized like a sum, never @inplace
OTHER_SUM = 0.9


class BlockGen:
    """Writes the body of one block: declarations on demand, typed equations, a return."""

    def __init__(self, r: R, prog: "ProgramGen", params: list[tuple[str, T]], taken: set[str],
                 envs: list[dict[str, Any]]):
        self.r, self.prog, self.taken, self.envs = r, prog, taken, envs
        self.x0, self.t0 = params[0]
        self.values: dict[T, list[str]] = {}
        for name, t in params:
            self.values.setdefault(t, []).append(name)
        self.expected: dict[str, T] = {}
        self.decls: list[str] = []
        self.decl_keys: dict[Any, list[tuple[str, Any]]] = {}
        self.shadowed: set[str] = set()  # functions hidden by a declaration of the same name
        self.used_functions: set[str] = set()
        self.groups = [fresh(r, taken) for _ in range(r.int(0, 2))]  # prefixes of dotted names
        dtypes = sorted({self.t0.dtype, *DTYPES}, key=str)
        self.universe = [T(self.t0.rows + (last,), d) for last in prog.lasts for d in dtypes]

    # --- names ---------------------------------------------------------------
    def decl_name(self) -> str:
        r = self.r
        if self.groups and r.coin(0.25):
            name = fresh(r, self.taken, r.pick(self.groups) + "." + r.name())
        else:
            name = fresh(r, self.taken)
            # a declaration would capture earlier calls of its name; cast must stay free to reach every dtype
            while name in self.used_functions or name == "cast":
                name = fresh(r, self.taken, name)
        if name in FUNCTIONS:
            self.shadowed.add(name)
        return name

    def value_name(self) -> str:
        if self.r.coin(0.2):  # a temporary written by hand
            n = self.r.int(0, 30)
            while f"%{n}" in self.taken:
                n += 1
            self.taken.add(f"%{n}")
            return f"%{n}"
        return fresh(self.r, self.taken)

    def function(self, choices: Sequence[str]) -> str | None:
        free = [f for f in choices if f not in self.shadowed]
        if not free:
            return None
        fn = self.r.pick(free)
        self.used_functions.add(fn)
        return fn

    # --- declarations --------------------------------------------------------
    def declare(self, key: Any, make: Callable[[], tuple[str, Any]]) -> tuple[str, Any]:
        """A declaration for key: an earlier one (applied at several sites) or a new one."""
        earlier = self.decl_keys.get(key)
        if earlier and self.r.coin():
            return self.r.pick(earlier)
        text, extra = make()
        name = self.decl_name()
        self.decls.append(f"{name}{self.r.odd(': ', ':', ' : ')}{text}")
        self.decl_keys.setdefault(key, []).append((name, extra))
        return name, extra

    def file_constant(self, ok: Callable[[Any], bool], fallback: Callable[[], K]) -> str:
        """Declaration arguments checked while building (eps, counts) see only the file's names."""
        env = self.prog.file_env
        return constant(self.r, tuple(env), [env], ok, fallback)[1]

    def block_constant(self, ok: Callable[[Any], bool], fallback: Callable[[], K]) -> tuple[str, int]:
        _, text, prec = constant(self.r, tuple(self.envs[0]), self.envs, ok, fallback)
        return text, prec

    def arg_value(self, a: ArgSpec, t: T) -> str:
        r, prog = self.r, self.prog
        if a.kind == "bool":
            return r.pick(["true", "false"])
        if a.kind == "enum":
            return r.pick(a.choices)
        if a.kind == "dtype":
            return r.pick(DTYPES)
        if a.kind == "int":
            return str(r.pick(a.choices))
        if a.kind == "axes":
            others = [x for x in t.rows if r.coin()]
            return r.pick([t.last, t.last, f"[{t.last}]", "[" + ", ".join(others + [t.last]) + "]"])
        if a.kind == "dim":
            return r.pick(prog.by_role["hidden"] if a.name == "hidden" else [t.last])
        if a.kind == "name":
            return r.pick(["proj", "dense", "c_proj", "fc_1"])
        if a.kind == "numbers":
            items = [r.pick(["1", "1.5", "2e0", ".25", "3."]) for _ in range(r.int(1, 4))]
            return "[" + r.odd(", ", ",").join(items) + r.odd("", ",") + "]"
        if a.kind != "expr":
            raise AssertionError(f"the generator does not know argument kind {a.kind!r}; teach it")
        if a.name in ("eps", "ln_eps"):
            return self.file_constant(lambda v: 0 < v <= 1, lambda: number(r.pick(["1e-5", "1e-6", "1e-12"])))
        if a.name == "steps":
            return self.file_constant(positive_int(10_000), lambda: literal(r, True, 1, 1000))
        if a.name == "momentum":
            return self.file_constant(lambda v: 0 <= v <= 1, lambda: number(r.pick(["0.1", "0.01", "1"])))
        if a.name in ("heads", "kv_heads", "head_dim"):
            dims = prog.by_role["head_dim" if a.name == "head_dim" else "heads"]
            if dims and r.coin():
                return r.pick(dims)
            return self.file_constant(positive_int(64), lambda: literal(r, True, 1, 8))
        if a.name in ("experts", "top_k"):  # top_k from 1 to 4 of 4 to 8 experts (E0121)
            low, high = (4, 8) if a.name == "experts" else (1, 4)
            return self.file_constant(lambda v: float(v).is_integer() and low <= v <= high,
                                      lambda: literal(r, True, low, high))
        if a.name in ("rope_theta", "init_gain"):
            return self.file_constant(lambda v: v > 0, lambda: number(r.pick(["10000.0", "1", "0.5"])))
        return self.block_constant(any_value, lambda: literal(r))[0]

    def kind_args(self, kind: str, t: T, fixed: dict[str, str] | None = None) -> str:
        """Arguments for a built-in kind, from its schema: a prefix positional, the rest by keyword."""
        r, spec, fixed = self.r, KINDS[kind], fixed or {}
        n_positional = r.int(0, len(spec.positional))
        # an argument naming another declaration (kind decl) is given only through ``fixed``, by a caller that
        # declared what it names
        chosen = {a.name: fixed.get(a.name) or self.arg_value(a, t) for a in spec.args
                  if a.name not in SIGNATURE_ARGS and (a.required or a.name in fixed or a.kind != "decl" and r.coin())}
        for rule in spec.implies:  # an argument its neighbour rules out takes the only value it may have
            when = chosen.get(rule.when, {True: "true", False: "false"}.get(spec.arg(rule.when).default))
            if when == str(rule.given).lower() and rule.arg in chosen:
                if rule.value is None:  # the argument can only stay unset
                    del chosen[rule.arg]
                    continue
                chosen[rule.arg] = str(rule.value.value if hasattr(rule.value, "value") else rule.value).lower()
        positional, keywords = [], []
        for a in spec.args:
            if a.name not in chosen:
                continue
            value = chosen[a.name]
            if a.positional and spec.positional.index(a) == len(positional) < n_positional:
                positional.append(value)
            else:
                keywords.append(f"{a.name}{r.odd('=', ' = ')}{value}")
        args = positional + r.shuffled(keywords)
        if not args and r.coin():
            return kind  # a kind without arguments needs no parentheses
        return f"{kind}({', '.join(args)}{r.odd('', ',') if args else ''})"

    def norm(self, t: T) -> str:
        kind = self.r.pick([k.name for k in KINDS.values() if k.category == "norm"])
        # a batch-coupled norm must state what padding does (E0435)
        fixed = {"axes": t.last, "padding": self.r.pick(["mask", "include"])}
        return self.declare(("norm", t.last), lambda: (self.kind_args(kind, t, fixed), None))[0]

    def branch(self, t: T) -> str:
        kind = self.r.pick(["self_attention", "mlp", "gated_mlp"] if self.prog.by_role["hidden"]
                           else ["self_attention"])
        return self.declare(kind, lambda: (self.kind_args(kind, t), None))[0]

    def linear(self, src: str, dst: str, t: T) -> str:
        fixed = {"in_dim": src, "out_dim": dst}
        return self.declare(("linear", src, dst), lambda: (self.kind_args("linear", t, fixed), None))[0]

    def extern(self, t: T) -> tuple[str, tuple[T, ...]]:
        """An extern whose call has type t; without a written dtype its result takes the first argument's."""
        def make() -> tuple[str, tuple[T, ...]]:
            r = self.r
            write_dtype = t.dtype is not None and r.coin()
            pool = self.universe + [u for u in self.values if not u.joined]
            params = [r.pick(pool) for _ in range(r.int(0, 2))]
            if not write_dtype and (params or t.dtype is not None):
                params.insert(0, r.pick([u for u in pool if u.dtype == t.dtype]))
            sig = ", ".join(f"{r.name()}: {type_text(r, p)}" for p in params)
            result = type_text(r, t if write_dtype else t.with_dtype(None))
            return f"extern({sig}) -> {result}", tuple(params)
        return self.declare(("extern", t), make)

    def instance(self, t: T) -> tuple[str, BlockInfo] | None:
        candidates = [b for b in self.prog.blocks if b.result == t and b.carried is None
                      and all(self.can_make(p) for p in b.params)]
        if not candidates:
            return None
        b = self.r.pick(candidates)
        return self.instance_of(b)

    def instance_of(self, b: BlockInfo) -> tuple[str, BlockInfo]:
        stack = b.params[0] == b.result and (b.carried is None or b.params[1] == b.carried) and self.r.coin(0.6)

        def make() -> tuple[str, BlockInfo]:
            if not stack:
                return b.name, b
            count = self.file_constant(positive_int(64), lambda: literal(self.r, True, 1, 24))
            atom = re.fullmatch(r"\w+(\s*\*\*\s*\w+)?", count)  # `Block * N` takes a power
            return f"{b.name} * {count if atom else f'({count})'}", b
        return self.declare(("instance", b.name, stack), make)

    def can_make(self, t: T) -> bool:
        return t in self.universe or t in self.values

    # --- expressions ---------------------------------------------------------
    def leaf(self, t: T) -> tuple[str, int]:
        if t.dtype is None and not t.joined and self.r.coin(0.1) and self.function(("zeros",)) is not None:
            return f"zeros({type_text(self.r, t)})", 5
        if t in self.values:
            return self.r.pick(self.values[t]), 5
        # a universe type nothing has produced yet: convert the first input
        text, cur = self.x0, self.t0
        if t.dtype != cur.dtype:
            fn = self.function(("cast",))
            assert fn is not None, "a type the generator cannot reach"
            text, cur = f"cast({text}, {t.dtype})", cur.with_dtype(t.dtype)
        if t.last != cur.last:
            text = f"{self.linear(cur.last, t.last, cur)}({text})"
        return text, 5

    def tensor(self, t: T, depth: int, top: bool = False) -> tuple[str, float]:
        """Text of an expression of type t and its precedence (1 sum, 2 product, 5 atom).

        At the top of an equation the expression is never a bare name: `h = x`
        would only rename x, which the language rejects.
        """
        r = self.r
        if not top and (depth <= 0 or r.coin(0.25)):
            return self.leaf(t)
        if t not in self.universe and not t.joined:
            forms = ["act", "dropout"]  # another input's rows: built only from that input
        else:
            forms = ["add", "add", "act", "dropout", "dropout", "scale"]
            if not t.joined:
                forms += ["norm", "norm", "branch", "branch", "linear", "extern", "scalar", "vector", "act_decl",
                          "instance", "instance", "cross", "bias", "gate", "product", "complement", "sub", "step"]
            if t.dtype is not None:
                forms.append("cast")
        built = self.form(r.pick(forms), t, depth - 1) or self.form("add", t, depth - 1)
        assert built is not None
        if built[1] == 5 and not top and r.fancy and r.coin(0.1):
            return f"({built[0]})", 5
        return built

    def form(self, form: str, t: T, sub: int) -> tuple[str, int] | None:
        r = self.r
        sp = r.odd(" ", "", "  ")
        if form == "add":
            (left, _), (right, rp) = self.tensor(t, sub), self.tensor(t, sub)
            return f"{left}{sp}+{sp}{right if rp > 1 else f'({right})'}", 1
        if form in ("scale", "scalar", "vector"):
            if form == "scale":
                factor, fp = self.block_constant(any_value, lambda: literal(r))
            else:
                key = (form, t.last if form == "vector" else None)
                factor, fp = self.declare(key, lambda: (self.kind_args(form, t, {"axis": t.last}), None))[0], 5
            operand, op = self.tensor(t, sub)
            if r.coin():
                left = factor if fp >= 2 else f"({factor})"
                return f"{left}{sp}*{sp}{operand if op >= 3 else f'({operand})'}", 2
            return f"{operand if op >= 2 else f'({operand})'}{sp}*{sp}{factor if fp >= 3 else f'({factor})'}", 2
        if form == "bias":
            name = self.declare(("bias", t.last), lambda: (self.kind_args("bias", t, {"axis": t.last}), None))[0]
            operand, op = self.tensor(t, sub)
            if r.coin():
                return f"{operand}{sp}+{sp}{name}", OTHER_SUM
            return f"{name}{sp}+{sp}{operand if op > 1 else f'({operand})'}", OTHER_SUM
        if form == "gate":
            fn = self.function(GATES)
            return None if fn is None else (f"{fn}({self.tensor(t, sub)[0]})", 5)
        if form == "product":  # a gate applied to a value, or any elementwise product
            (left, lp), (right, rp) = self.tensor(t, sub), self.tensor(t, sub)
            return f"{left if lp >= 2 else f'({left})'}{sp}*{sp}{right if rp >= 3 else f'({right})'}", 2
        if form == "sub":
            (left, _), (right, rp) = self.tensor(t, sub), self.tensor(t, sub)
            return f"{left}{sp}-{sp}{right if rp > 1 else f'({right})'}", OTHER_SUM
        if form == "step":  # nGPT's interpolation x + alpha * (target - x), alpha a learned vector
            state, _ = self.leaf(t)
            alpha = self.declare(("vector", t.last), lambda: (self.kind_args("vector", t, {"axis": t.last}), None))[0]
            target = self.tensor(t, sub)[0]
            return f"{state}{sp}+{sp}{alpha}{sp}*{sp}({target}{sp}-{sp}{state})", 1
        if form == "complement":
            operand, op = self.tensor(t, sub)
            return f"1{sp}-{sp}{operand if op >= 2 else f'({operand})'}", OTHER_SUM
        if form == "act":
            fn = self.function(ACTIVATIONS)
            return None if fn is None else (f"{fn}({self.tensor(t, sub)[0]})", 5)
        if form == "dropout":
            fn = self.function(("dropout", "drop_path", "layer_drop"))
            if fn is None:
                return None
            p, _ = self.block_constant(lambda v: 0 <= v < 1, lambda: number(r.pick(["0.1", "0", "0.0", ".5"])))
            kwargs = [f"p={p}"] + ([f"mask={r.pick(MASKS)}"] if fn == "dropout" and r.coin() else [])
            return f"{fn}({self.tensor(t, sub)[0]}, {', '.join(r.shuffled(kwargs))})", 5
        if form == "cast":
            if self.function(("cast",)) is None:
                return None
            src = r.pick([u for u in (self.universe if t in self.universe else self.values) if u.axes == t.axes])
            return f"cast({self.tensor(src, sub)[0]}, {t.dtype})", 5
        if form == "norm":
            return f"{self.norm(t)}({self.tensor(t, sub)[0]})", 5
        if form == "branch":
            return f"{self.branch(t)}({self.tensor(t, sub)[0]})", 5
        if form == "cross":
            memory = r.pick([u for u in self.values if not u.joined] + self.universe)
            name = self.declare("cross", lambda: (self.kind_args("cross_attention", t), None))[0]
            return f"{name}({self.tensor(t, sub)[0]}, {self.tensor(memory, sub)[0]})", 5
        if form == "linear":
            src = r.pick(self.prog.lasts)
            return f"{self.linear(src, t.last, t)}({self.tensor(t.with_last(src), sub)[0]})", 5
        if form == "act_decl":
            name = self.declare("activation", lambda: (self.kind_args("activation", t), None))[0]
            return f"{name}({self.tensor(t, sub)[0]})", 5
        if form == "extern":
            name, params = self.extern(t)
            return f"{name}({', '.join(self.tensor(p, sub)[0] for p in params)})", 5
        if form == "instance":
            found = self.instance(t)
            if found is None:
                return None
            name, b = found
            return f"{name}({', '.join(self.tensor(p, sub)[0] for p in b.params)})", 5
        raise AssertionError(form)

    # --- statements ----------------------------------------------------------
    def carried_call(self, depth: int) -> str | None:
        """``y, s = layers(x, s0)``: a call of a block with a carried second result, its start often zeros."""
        r = self.r
        candidates = [b for b in self.prog.blocks if b.carried is not None and all(self.can_make(p) for p in b.params)]
        if not candidates:
            return None
        name, b = self.instance_of(r.pick(candidates))
        args = [self.tensor(p, depth - 1)[0] for p in b.params]
        if b.params[1].dtype is None and self.function(("zeros",)) is not None and r.coin(0.6):
            args[1] = f"zeros({type_text(r, b.params[1])})"
        targets = [self.value_name(), self.value_name()]
        for target, t in zip(targets, (b.result, b.carried)):
            self.values.setdefault(t, []).append(target)
            self.expected[target] = t
        return f"{targets[0]}{r.odd(', ', ',')}{targets[1]}{r.odd(' = ', '=')}{name}({', '.join(args)})"

    def equation(self, depth: int, form: str | None = None) -> str:
        r = self.r
        target = self.value_name()
        fn = self.function(("concat",)) if form is None and r.coin(0.1) else None
        built = self.form(form, self.t0, depth - 1) if form else None
        if built is not None:
            t, (text, prec) = self.t0, built
        elif fn is not None:
            parts = [r.pick([u for u in self.universe if u.dtype == self.t0.dtype]) for _ in range(r.int(2, 3))]
            t = T(self.t0.rows + ("+".join(p.last for p in parts),), parts[0].dtype)
            text = f"{fn}({', '.join(self.tensor(p, depth - 1)[0] for p in parts)})"
            prec = 5
        else:
            t = self.t0 if r.coin() else r.pick([u for u in self.values if u.joined] + self.universe)
            text, prec = self.tensor(t, r.int(1, max(depth, 1)), top=True)
        attrs = ""
        if prec == 1 and r.coin(0.3):
            attrs = r.pick(["@inplace ", "@ inplace ", "@inplace\n  ", "@inplace @inplace "])
        self.values.setdefault(t, []).append(target)
        self.expected[target] = t
        return f"{attrs}{target}{r.odd(' = ', '=', '  =  ')}{text}"


class ProgramGen:
    def __init__(self, r: R):
        self.r = r
        self.taken: set[str] = set()
        self.file_env: dict[str, int | float] = {}
        self.by_role: dict[str, list[str]] = {}
        self.blocks: list[BlockInfo] = []
        self.lasts: list[str] = []

    def top_level(self) -> list[str]:
        """dims with consts among them, each referring only to what came before it."""
        r = self.r
        plan = [("batch", r.int(1, 2)), ("seq", r.int(1, 2)), ("model", r.int(1, 2)), ("hidden", r.int(0, 2)),
                ("heads", r.int(0, 1)), ("head_dim", r.int(0, 1))]
        items = []
        for role, count in plan:
            self.by_role[role] = []
            for _ in range(count):
                if r.coin(0.2):
                    items.append(self.const_item())
                name = fresh(r, self.taken)
                self.by_role[role].append(name)
                size = ""
                if r.coin(0.3 if role in ("batch", "seq") else 0.7):
                    env = self.file_env
                    t, text, _ = constant(r, tuple(env), [env], positive_int(4096), lambda: literal(r, True, 1, 64))
                    env[name] = int(kval(t, env))
                    size = f"{r.odd(' = ', '=', ' =')}{text}"
                items.append(f"dim {name}{r.odd(': ', ':', ' : ')}{role}{size}")
        items += [self.const_item() for _ in range(r.int(0, 2))]
        self.lasts = self.by_role["model"] + self.by_role["hidden"]
        return items

    def const_item(self) -> str:
        r = self.r
        name = fresh(r, self.taken)
        t, text, _ = constant(r, tuple(self.file_env), [self.file_env], any_value, lambda: literal(r))
        self.file_env[name] = kval(t, self.file_env)
        return f"const {name}{r.odd(' = ', '=')}{text}"

    def row_axes(self) -> tuple[str, ...]:
        rows = self.by_role["batch"] + self.by_role["seq"]
        return tuple(self.r.shuffled(rows)[: self.r.int(0, min(3, len(rows)))])

    def block(self, main: T, knobs: Knobs, gen: Generated) -> str:
        r = self.r
        carried = r.coin(0.3)
        keyword = "block" if carried else r.pick(["block", "model"])
        # a block named like a built-in kind would capture that kind's declarations
        name = self.r.name()
        while name in self.taken or name in KINDS:
            name += "_"
        self.taken.add(name)
        # most blocks share the program's state type, so that later blocks can run earlier ones
        t0 = main if r.coin(0.7) else T(self.row_axes() + (r.pick(self.by_role["model"]),),
                                         r.pick([None, None, *DTYPES]))
        # a carried stream: a second input (with the state's rows) its second result continues; a stack threads it
        carried = T(t0.rows + (r.pick(self.lasts),), r.pick([None, None, *DTYPES])) if carried else None
        extra = [T(self.row_axes() + (r.pick(self.lasts),), r.pick([None, *DTYPES])) for _ in range(r.int(0, 2))
                 if not carried]
        # a block's own names may repeat block names, never the file's dims and constants
        taken = {n for n in self.taken if n not in {b.name for b in self.blocks} and n != name}
        params = [(fresh(r, taken), t) for t in (t0, *([carried] if carried else []), *extra)]

        envs = [dict(self.file_env, layer=layer, num_layers=n) for layer, n in LAYER_ENVS]
        consts = []
        for _ in range(r.int(0, 2)):
            cname = fresh(r, taken)
            t, text, _ = constant(r, tuple(envs[0]), envs, any_value, lambda: literal(r))
            for env in envs:
                env[cname] = kval(t, env)
            consts.append(f"const {cname} = {text}")

        body = BlockGen(r, self, params, taken, envs)
        result = t0 if r.coin(0.75) else r.pick(body.universe)
        # a model usually runs a stack of an earlier block first
        equations = [body.equation(knobs.depth, "instance")] if self.blocks and r.coin(0.6) else []
        call = body.carried_call(knobs.depth) if r.coin(0.7) else None
        equations += [call] if call else []
        equations += [body.equation(knobs.depth) for _ in range(r.int(1, knobs.equations))]
        ret_text, _ = body.tensor(result, r.int(0, knobs.depth))
        if carried:
            ret_text += f"{r.odd(', ', ',')}{body.tensor(carried, r.int(0, knobs.depth))[0]}"
        for _ in range(r.int(0, 2)):  # unused declarations are legal (a warning)
            kind = r.pick(sorted(KINDS))
            t = r.pick(body.universe)
            if kind in ("mlp", "gated_mlp", "moe") and not self.by_role["hidden"]:
                continue
            fixed = {"in_dim": t.last, "out_dim": r.pick(self.lasts)} if kind == "linear" else {}
            body.declare(("unused", len(body.decls)), lambda: (body.kind_args(kind, t, fixed), None))

        statements = self.interleave(consts, equations, body.decls, f"return {ret_text}", taken)
        sig = ", ".join(f"{n}{r.odd(': ', ':')}{type_text(r, t)}" for n, t in params) + r.odd("", ",")
        gen.values[name] = body.expected
        gen.results[name] = result
        self.blocks.append(BlockInfo(name, tuple(t for _, t in params), result, carried))
        results = type_text(r, result) if not carried else f"({type_text(r, result)}, {type_text(r, carried)})"
        head = f"{keyword} {name}({sig}) -> {results} {{"
        return head + "".join(r.sep() + "  " + s for s in statements) + r.sep() + "}"

    def interleave(self, consts: list[str], equations: list[str], decls: list[str], ret: str,
                   taken: set[str]) -> list[str]:
        """Statements in a random order that keeps constants, and equations, in their order."""
        r = self.r
        queues = [list(consts), list(equations), r.shuffled(decls)]
        out: list[str] = []
        while any(queues):
            out.append(r.pick([q for q in queues if q]).pop(0))
        out.insert(r.int(0, len(out)) if r.coin(0.2) else len(out), ret)
        # `-> [D]` and then a statement whose name starts with f32 would lex as the result's dtype: keep them apart
        spaced: list[str] = []
        for s in out:
            if spaced and re.search(r"extern\(.*\)\s*->\s*\[[^\]]*\]$", spaced[-1], re.S) and \
                    re.match(r"(@\s*inplace\s+)*(f64|f32|f16|bf16)", s):
                spaced.append(f"const {fresh(r, taken)} = 1")
            spaced.append(s)
        return spaced


@st.composite
def programs(draw) -> Generated:
    knobs = Knobs(seed=draw(st.integers(0, 2**32 - 1)), fancy=draw(st.booleans()), blocks=draw(st.integers(1, 3)),
                  equations=draw(st.integers(1, 6)), depth=draw(st.integers(1, 3)))
    r = R(knobs.seed, knobs.fancy)
    prog = ProgramGen(r)
    items = prog.top_level()
    gen = Generated("", prog.file_env)
    main = T(prog.row_axes() + (r.pick(prog.by_role["model"]),), r.pick([None, None, *DTYPES]))
    for _ in range(knobs.blocks):
        items.append(prog.block(main, knobs, gen))
    gen.text = "".join(item + r.sep() for item in items)
    return gen
# --- generated programs ------------------------------------------------------------
def type_pair(t: TensorType) -> tuple[tuple[str, ...], str | None]:
    return t.names, t.dtype.value if t.dtype else None


@settings(BASE, max_examples=400)
@given(programs())
def test_generated_programs_parse_and_type_as_predicted(gen: Generated) -> None:
    program = blockir.parse(gen.text, "gen.block")
    for c in program.consts:
        assert C.evaluate(c.value, gen.file_env) == gen.file_env[c.name], c.name
    for d in program.dims:
        if d.size is not None:
            assert C.evaluate(d.size, gen.file_env) == gen.file_env[d.name], d.name
    assert [b.name for b in program.blocks] == list(gen.values)
    for block in program.blocks:
        defined: set[str] = set()
        for op in block.ops:
            assert set(op.operands) <= defined, f"{op} uses a value before its definition"
            for result in op.results:
                assert isinstance(block.type_of(result), TensorType)
                defined.add(result)
        for name, t in gen.values[block.name].items():
            assert type_pair(block.type_of(name)) == (t.axes, t.dtype), name
        out = block.output
        assert isinstance(out, OutputOp)
        expected = gen.results[block.name]
        assert type_pair(block.type_of(out.value)) == (expected.axes, expected.dtype)


@settings(BASE, max_examples=400)
@given(programs())
def test_generated_programs_round_trip_through_the_printer(gen: Generated) -> None:
    program = blockir.parse(gen.text, "gen.block")
    printed = format_program(program)
    again = blockir.parse(printed, "printed.block")
    assert again == program
    assert format_program(again) == printed


@settings(BASE, max_examples=300)
@given(programs())
def test_generated_programs_verify_without_crashing(gen: Generated) -> None:
    program = blockir.parse(gen.text, "gen.block")
    for d in blockir.verify(program):
        assert isinstance(d, Diagnostic)
        render(d, {"gen.block": gen.text})


# --- robustness: anything may come in, only diagnostics come out --------------------
def check_diagnostics(diags: Sequence[Diagnostic], filename: str, sources: dict[str, str]) -> None:
    for d in diags:
        assert re.fullmatch(r"[EW]\d{4}", d.code), d
        for span in [d.span, *(n.span for n in d.notes if n.span is not None)]:
            assert span.filename == filename, d
            assert span.line >= 1 and span.column >= 1, d
        text = render(d, sources)
        assert text.startswith(f"{d.span}: {d.severity}[{d.code}]: {d.message}")
        # spans count lines by '\n' alone: the quoted line must be the one the span points into
        # (compared by its printable characters, however control characters are shown)
        lines = sources.get(filename, "").split("\n")
        if filename in sources and d.span.line <= len(lines):
            quoted = text[len(f"{d.span}: {d.severity}[{d.code}]: {d.message}\n"):].split("\n")[0]
            expected = lines[d.span.line - 1].expandtabs(1)[:200]
            assert visible(quoted) == "  " + visible(expected), (d, quoted, expected)


def visible(line: str) -> str:
    return "".join(c for c in line if c.isprintable())


def parse_or_diagnose(text: str, filename: str = "fuzz.block") -> Program | None:
    """Parse; a failure must be a BlockError whose diagnostics have valid spans and render.

    Whatever parses must verify without raising and print to text that parses
    back to the same program.
    """
    try:
        program = blockir.parse(text, filename)
    except BlockError as exc:
        assert any(d.is_error for d in exc.diagnostics), "a BlockError without an error"
        check_diagnostics(exc.diagnostics, filename, {filename: text})
        assert str(exc)
        return None
    for d in blockir.verify(program):
        render(d, {filename: text})
    assert blockir.parse(format_program(program), "printed.block") == program
    return program


EXAMPLE_TEXTS = [p.read_text() for p in EXAMPLES]
TOKEN = re.compile(r"%\d+|[A-Za-z_]\w*|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|->|\*\*|#[^\n]*|\S")
# pieces of the language and of what it is not: keywords, punctuation, literals
# at the limits, characters the lexer must refuse
VOCAB = ("dim", "const", "block", "model", "return", "extern", "true", "false", "layer", "num_layers", ":", "=",
         "(", ")", "[", "]", "{", "}", ",", ".", "->", "+", "-", "*", "/", "**", "@", "@inplace", "%0", "%7", "#",
         "\n", "B", "S", "D", "x", "h", "y", "8", "0", "-1", "1e-5", "0.1", "1e999", "2 ** 10 ** 10", "f32", "bf16",
         "batch", "seq", "heads", "layernorm(D)", "rmsnorm", "self_attention(heads=2)", "mlp(F)", "scalar",
         "vector(D)", "dropout(x, p=0.1)", "drop_path", "p=", "mask=row", "cast(x, f16)", "concat(x, x)", "gelu",
         "Layer * 3", "x + x", "2 * x", "\u0177", "\x00", "\t", "\u2028", "\r", "\x0b", "$", "'", '"', "\\",
         "((((", "))))", "`", "\ufeff", "\u0661", "\U0001f600")


def _at(draw, text: str) -> int:
    return draw(st.integers(0, max(len(text) - 1, 0)))


def _char(draw) -> str:
    return draw(st.one_of(st.sampled_from([c for c in VOCAB if len(c) == 1]), st.characters()))


def _tokens(text: str) -> list[re.Match[str]]:
    return list(TOKEN.finditer(text)) or [re.match(r"", text)]  # type: ignore[list-item]


def m_delete_char(draw, text: str) -> str:
    i = _at(draw, text)
    return text[:i] + text[i + 1:]


def m_insert_char(draw, text: str) -> str:
    i = draw(st.integers(0, len(text)))
    return text[:i] + _char(draw) + text[i:]


def m_duplicate_char(draw, text: str) -> str:
    i = _at(draw, text)
    return text[:i] + text[i:i + 1] * 2 + text[i + 1:]


def m_swap_chars(draw, text: str) -> str:
    i, j = sorted((_at(draw, text), _at(draw, text)))
    return text[:i] + text[j:j + 1] + text[i + 1:j] + text[i:i + 1] + text[j + 1:] if i < j else text


def m_delete_token(draw, text: str) -> str:
    m = draw(st.sampled_from(_tokens(text)))
    return text[:m.start()] + text[m.end():]


def m_duplicate_token(draw, text: str) -> str:
    m = draw(st.sampled_from(_tokens(text)))
    return text[:m.end()] + " " + m.group() + text[m.end():]


def m_replace_token(draw, text: str) -> str:
    m = draw(st.sampled_from(_tokens(text)))
    return text[:m.start()] + draw(st.sampled_from(VOCAB)) + text[m.end():]


def m_insert_token(draw, text: str) -> str:
    m = draw(st.sampled_from(_tokens(text)))
    return text[:m.start()] + draw(st.sampled_from(VOCAB)) + " " + text[m.start():]


def m_swap_tokens(draw, text: str) -> str:
    tokens = _tokens(text)
    a, b = sorted((draw(st.sampled_from(tokens)), draw(st.sampled_from(tokens))), key=lambda m: m.start())
    if a.end() > b.start():
        return text
    return text[:a.start()] + b.group() + text[a.end():b.start()] + a.group() + text[b.end():]


def m_delete_line(draw, text: str) -> str:
    lines = text.split("\n")
    del lines[_at(draw, lines)]  # type: ignore[arg-type]
    return "\n".join(lines)


def m_duplicate_line(draw, text: str) -> str:
    lines = text.split("\n")
    i = _at(draw, lines)  # type: ignore[arg-type]
    return "\n".join(lines[:i + 1] + lines[i:])


def m_swap_lines(draw, text: str) -> str:
    lines = text.split("\n")
    i, j = _at(draw, lines), _at(draw, lines)  # type: ignore[arg-type]
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def m_splice_line(draw, text: str) -> str:
    """A line of another example: real statements in the wrong place, with names from elsewhere."""
    donor = draw(st.sampled_from(EXAMPLE_TEXTS)).split("\n")
    lines = text.split("\n")
    lines.insert(draw(st.integers(0, len(lines))), donor[_at(draw, donor)])  # type: ignore[arg-type]
    return "\n".join(lines)


def m_truncate(draw, text: str) -> str:
    return text[:draw(st.integers(0, len(text)))]


MUTATIONS = (m_delete_char, m_insert_char, m_duplicate_char, m_swap_chars, m_delete_token, m_duplicate_token,
             m_replace_token, m_insert_token, m_swap_tokens, m_delete_line, m_duplicate_line, m_swap_lines,
             m_splice_line, m_truncate)


@st.composite
def mutants(draw) -> str:
    text = draw(st.sampled_from(EXAMPLE_TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        text = draw(st.sampled_from(MUTATIONS))(draw, text)
    return text


@st.composite
def token_soups(draw) -> str:
    """Language pieces in random order: gets past the lexer, into the parser and the builder."""
    joiner = draw(st.sampled_from([" ", "", "\n"]))
    return joiner.join(draw(st.lists(st.sampled_from(VOCAB), max_size=40)))


@settings(BASE, max_examples=300)
@given(st.text(max_size=300))
def test_random_text_only_raises_block_errors(text: str) -> None:
    parse_or_diagnose(text)


@settings(BASE, max_examples=300)
@given(token_soups())
def test_token_soup_only_raises_block_errors(text: str) -> None:
    parse_or_diagnose(text)


@settings(BASE, max_examples=800)
@given(mutants())
def test_mutated_examples_only_raise_block_errors(text: str) -> None:
    parse_or_diagnose(text)


def _first_bad_byte(data: bytes) -> int | None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return None


@settings(BASE, max_examples=200)
@given(st.one_of(st.binary(max_size=200),
                 st.tuples(st.sampled_from(EXAMPLE_TEXTS), st.integers(0, 10**6), st.binary(min_size=1, max_size=4))
                 .map(lambda t: (lambda b, i: b[:i % (len(b) + 1)] + t[2] + b[i % (len(b) + 1):])(
                     t[0].encode(), t[1]))))
def test_random_bytes_decode_to_text_or_e0004(data: bytes) -> None:
    bad = _first_bad_byte(data)
    try:
        text = decode(data, "fuzz.block")
    except BlockError as exc:
        assert bad is not None
        (d,) = exc.diagnostics
        check_diagnostics([d], "fuzz.block", {})
        # the position of the first byte that is not UTF-8 (columns count bytes)
        line_start = data.rfind(b"\n", 0, bad) + 1
        assert (d.code, d.span.line, d.span.column) == ("E0004", data.count(b"\n", 0, bad) + 1, bad - line_start + 1)
        return
    assert bad is None
    parse_or_diagnose(text)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mutants")


@settings(BASE, max_examples=150)
@given(text=mutants(), junk=st.sampled_from([b"", b"", b"", b"\xff", b"\xc3", b"\xed\xa0\x80"]))
def test_cli_check_on_mutated_files_exits_0_or_1(scratch: Path, text: str, junk: bytes) -> None:
    path = scratch / "mutant.block"
    data = text.encode()
    path.write_bytes(data[: len(data) // 2] + junk + data[len(data) // 2:])
    for werror in ([], ["--werror"]):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(["check", *werror, str(path)])
        assert code in (0, 1), err.getvalue()
        assert "Traceback" not in err.getvalue()
        errors_shown = "error[" in err.getvalue() or (werror and "warning[" in err.getvalue())
        assert (code == 1) == bool(errors_shown), err.getvalue()


# --- regressions: the smallest input of each defect found while writing these properties ---
def round_trips(text: str) -> None:
    program = blockir.parse(text, "case.block")
    printed = format_program(program)
    assert blockir.parse(printed, "printed.block") == program, printed


def test_printer_keeps_a_const_that_a_dim_size_uses_before_the_dim() -> None:
    round_trips("const k = 4\ndim D: model = 2 * k\n")


def test_a_dtype_name_cannot_name_a_value() -> None:
    # after an extern's result type `f32` would read as that type's dtype, so it is reserved
    with pytest.raises(BlockError) as info:
        blockir.parse("dim D: model\nblock A(x: [D]) -> [D] {\n  f32 = e(x)\n  e: extern(x: [D]) -> [D]\n"
                      "  return f32\n}\n", "case.block")
    assert info.value.diagnostics[0].message == "value 'f32' is a dtype name"


def test_a_name_that_starts_with_a_dtype_after_an_extern_result_stays_a_name() -> None:
    # the dtype terminal matched the prefix of `f32_norm`: the extern silently
    # became f32 and the declaration was named `_norm`
    text = ("dim D: model\nblock A(x: [D]) -> [D] {\n  e: extern(x: [D]) -> [D]\n  f32_norm: layernorm(D)\n"
            "  return f32_norm(e(x))\n}\n")
    (block,) = blockir.parse(text, "case.block").blocks
    assert [d.name for d in block.decls] == ["e", "f32_norm"]
    assert block.decl_map["e"].result.dtype is None


def test_a_builtin_function_name_cannot_name_a_declaration() -> None:
    # a declaration named drop_path would shadow the function the printer writes for sample dropout
    with pytest.raises(BlockError) as info:
        blockir.parse("dim D: model\nblock A(x: [D]) -> [D] {\n  drop_path: activation(relu)\n"
                      "  y = dropout(x, p=0.1, mask=sample)\n  return drop_path(y)\n}\n", "case.block")
    assert info.value.diagnostics[0].message == "declaration 'drop_path' is a built-in function"


def test_a_diagnostic_after_a_form_feed_quotes_the_line_it_points_into() -> None:
    # form feeds and Unicode line separators are not line breaks for the parser,
    # so the rendering must not split the quoted text at them either
    with pytest.raises(BlockError) as info:
        blockir.parse("# page\x0c\ndim D: model = 0\n", "case.block")
    assert str(info.value).split("\n")[1] == "  dim D: model = 0"


def test_a_literal_beyond_the_float_range_is_rejected_or_round_trips() -> None:
    text = "dim D: model\nblock A(x: [D]) -> [D] {\n  y = 1e999 * x\n  return y\n}\n"
    try:
        blockir.parse(text, "case.block")
    except BlockError:
        return
    round_trips(text)


def test_mutually_instantiating_blocks_report_a_bounded_number_of_cycles() -> None:
    # n blocks that each instantiate all the others hold sum over k of C(n, k) * (k-1)! simple
    # cycles (16,064 for n = 8, over a million for n = 10): listing each one is exponential
    n = 8
    lines = ["dim D: model"]
    for i in range(n):
        lines += [f"block B{i}(x: [D]) -> [D] {{", *(f"  i{j}: B{j}" for j in range(n) if j != i), "  return x", "}"]
    start = time.perf_counter()
    with pytest.raises(BlockError) as info:
        blockir.parse("\n".join(lines), "cycles.block")
    assert time.perf_counter() - start < 5
    assert 1 <= sum(d.code == "E0118" for d in info.value.diagnostics) <= n
