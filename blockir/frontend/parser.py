"""Text → syntax tree. The only module that touches lark; its errors become diagnostics.

The syntax tree is built while lark parses (an inline LALR transformer), not
by a second walk over a parse tree: no lark Tree is ever allocated, and a
too-deep expression stops the parse where it is found.
"""
from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from blockir.collector import gc_paused
from blockir.diagnostics import BlockError, Diagnostic, Span, error
from blockir.frontend import ast
from blockir.frontend.tables import grammar_text, load_lark

MAX_BYTES = 1 << 20
MAX_NESTING = 64
MAX_EXPR_DEPTH = 256
MAX_EXPECTED_SHOWN = 8
MAX_EXACT_DIGITS = 4000

# Lark terminal names → what a person calls them.
TOKEN_NAMES = {
    "NAME": "a name",
    "NUMBER": "a number",
    "TEMP": "a temporary like %0",
    "DTYPE": "a dtype (f32, bf16, f16, f64)",
    "$END": "end of file",
}


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return load_lark(transformer=_BUILDER)


# Sets of tokens that say one thing together: when every token of a set may come next, the message
# names the set instead of listing its tokens (a token is its literal text, or its terminal's name).
EXPRESSION_START = frozenset({"(", "-", "[", "false", "true", "NAME", "NUMBER", "TEMP"})
TOKEN_GROUPS = (
    ("an expression", EXPRESSION_START),
    ("an expression", EXPRESSION_START - {"-"}),  # a stack's count, which cannot start with a minus
    ("a statement", frozenset({"@", "const", "return", "NAME", "TEMP"})),
    ("an operator", frozenset({"+", "-", "*", "/", "//", "%", "**"})),
)


def _token_key(name: str) -> str:
    """A terminal's literal text when it is a fixed string, else its name."""
    try:
        pattern = _lark().get_terminal(name).pattern
    except KeyError:
        return name
    return pattern.value if pattern.type == "str" else name


def _key_label(key: str) -> str:
    return TOKEN_NAMES.get(key, key.lower() if key.isupper() else f"'{key}'")


def _token_label(name: str) -> str:
    return _key_label(_token_key(name))


def _expected(names: set[str]) -> str:
    """What may come next, in words: each whole group of tokens by its name, the other tokens one by one."""
    keys = {_token_key(n) for n in names}
    groups = [(label, tokens) for label, tokens in TOKEN_GROUPS if tokens <= keys]
    rest = keys.difference(*(tokens for _, tokens in groups))
    labels = sorted({_key_label(k) for k in rest}) + sorted({label for label, _ in groups})
    labels = sorted(labels, key=lambda text: (not text.startswith("'"), text))
    shown = labels[:MAX_EXPECTED_SHOWN]
    if len(labels) > len(shown):
        return ", ".join(shown) + f", … ({len(labels) - len(shown)} more)"
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


def _found(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    return f"{_token_label(token.type)} '{token.value}'" if token.type in TOKEN_NAMES else f"'{token.value}'"


def _syntax_diagnostic(exc: UnexpectedInput, filename: str, text: str) -> Diagnostic:
    line = getattr(exc, "line", None) or 1
    column = getattr(exc, "column", None) or 1
    if isinstance(exc, UnexpectedCharacters):
        ch = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        return error("E0002", f"unexpected character {ch!r}", Span(filename, line, column, column + 1),
                     hint="names start with a letter or '_'; comments start with '#'")
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        lines = text.rstrip("\n").split("\n")  # point after the last written character
        end_line = len(lines)
        end_col = len(lines[-1]) + 1
        expected = exc.expected if isinstance(exc, UnexpectedEOF) else exc.expected
        return error("E0003", f"unexpected end of file; expected {_expected(set(expected))}",
                     Span(filename, end_line, end_col, end_col + 1),
                     hint="a block body ends with '}'")
    assert isinstance(exc, UnexpectedToken)
    tok = exc.token
    end = column + max(len(str(tok.value)), 1)
    return error("E0001", f"unexpected {_found(tok)}; expected {_expected(set(exc.expected))}",
                 Span(filename, line, column, end))


def _precheck(text: str, filename: str) -> Diagnostic | None:
    """Reject inputs whose size or bracket nesting would make parsing unbounded."""
    if len(text) > MAX_BYTES:
        return error("E0005", f"file is {len(text)} characters; the limit is {MAX_BYTES}", Span(filename, 1, 1),
                     hint="a .block file describes one layer family; split very large files")
    depth, line, col, in_comment = 0, 1, 1, False
    for ch in text:
        if ch == "\n":
            line, col, in_comment = line + 1, 1, False
            continue
        if ch == "#":
            in_comment = True
        if not in_comment:
            if ch in "([{":
                depth += 1
                if depth > MAX_NESTING:
                    return error("E0005", f"brackets nest deeper than {MAX_NESTING} levels",
                                 Span(filename, line, col, col + 1), hint="name intermediate values instead of nesting")
            elif ch in ")]}":
                depth = max(depth - 1, 0)
        col += 1
    return None


def decode(data: bytes, filename: str) -> str:
    """Bytes → text, or a BlockError pointing at the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        head = data[: exc.start]
        line = head.count(b"\n") + 1
        column = exc.start - (head.rfind(b"\n") + 1) + 1
        raise BlockError([error("E0004", f"file is not UTF-8 text (byte 0x{data[exc.start]:02x})",
                                Span(filename, line, column, column + 1))]) from None


def parse_ast(text: str, filename: str = "<string>") -> ast.ProgramAst:
    """Parse text into a syntax tree; raise BlockError with a readable diagnostic on bad syntax."""
    pre = _precheck(text, filename)
    if pre is not None:
        raise BlockError([pre], {filename: text})
    with _LOCK, gc_paused():
        _BUILDER.start_file(filename)
        try:
            items = _lark().parse(text)
        except UnexpectedInput as exc:
            raise BlockError([_syntax_diagnostic(exc, filename, text)], {filename: text}) from None
        except _DepthError as exc:
            raise BlockError([exc.diagnostic], {filename: text}) from None
        finally:
            _BUILDER.start_file("<string>")  # drop the positions of this file
    return ast.ProgramAst(filename, tuple(items))


class _DepthError(Exception):
    def __init__(self, diagnostic: Diagnostic):
        self.diagnostic = diagnostic


# (line, column, end line, end column, expression depth) of a token or of a node built from tokens
Extent = tuple[int, int, int, int, int]


class _ToAst(Transformer):
    """Builds ast nodes bottom-up as lark reduces each rule, bounding expression depth.

    Lark hands an inline transformer only the children of a rule, so the extent of every node (its
    first and last character, including brackets the tree drops) is kept on the side, keyed by the
    node's id; the nodes are alive for the whole parse, so no id is reused while it is looked up.
    """

    def __init__(self) -> None:
        super().__init__(visit_tokens=False)
        self.start_file("<string>")

    def start_file(self, filename: str) -> None:
        self.filename = filename
        self.extents: dict[int, Extent] = {}

    # --- positions ---------------------------------------------------------
    def _extent(self, node: Any) -> Extent:
        if isinstance(node, Token):
            return (node.line or 1, node.column or 1, node.end_line or 1, node.end_column or 1, 1)
        return self.extents[id(node)]

    def _keep(self, node: Any, first: Any, last: Any, depth: int = 1) -> Any:
        a, b = self._extent(first), self._extent(last)
        self.extents[id(node)] = (a[0], a[1], b[2], b[3], depth)
        return node

    def _span(self, first: Any, last: Any | None = None) -> Span:
        a = self._extent(first)
        b = self._extent(last) if last is not None else a
        return Span(self.filename, a[0], a[1], b[3] if b[2] == a[0] else None)

    def _token_span(self, tok: Token) -> Span:
        return Span(self.filename, tok.line or 1, tok.column or 1,
                    tok.end_column if tok.end_line == tok.line else None)

    # --- expressions -----------------------------------------------------
    def _deep(self, node: Any, first: Any, last: Any, children: list[Any], span: Span) -> Any:
        d = 1 + max((self.extents[id(c)][4] for c in children if not isinstance(c, Token)), default=0)
        if d > MAX_EXPR_DEPTH:
            raise _DepthError(error("E0005", f"expression nests deeper than {MAX_EXPR_DEPTH} operations", span,
                                    hint="name intermediate values instead of chaining"))
        return self._keep(node, first, last, d)

    def _binop(self, op: str, c: list[Any]) -> ast.BinOp:
        s = self._span(c[0], c[1])
        return self._deep(ast.BinOp(op, c[0], c[1], s), c[0], c[1], c, s)

    def add(self, c):
        return self._binop("+", c)

    def sub(self, c):
        return self._binop("-", c)

    def mul(self, c):
        return self._binop("*", c)

    def div(self, c):
        return self._binop("/", c)

    def floordiv(self, c):
        return self._binop("//", c)

    def mod(self, c):
        return self._binop("%", c)

    def pow(self, c):
        return self._binop("**", c)

    def neg(self, c):
        minus, operand = c
        s = self._span(minus, operand)
        return self._deep(ast.Neg(operand, s), minus, operand, [operand], s)

    def paren(self, c):
        lpar, inner, rpar = c
        depth = self._extent(inner)[4]
        return self._keep(inner, lpar, rpar, depth)  # the node stays; its extent now covers the brackets

    def number(self, c):
        tok = c[0]
        text = str(tok)
        value: int | float = float(text)
        if text.isdigit():
            # Python refuses to convert thousands of digits; such a literal only needs to be known too large
            value = int(text) if len(text) <= MAX_EXACT_DIGITS else 10 ** (len(text) - 1)
        return self._keep(ast.Num(value, self._token_span(tok)), tok, tok)

    def true(self, c):
        return self._keep(ast.Ref("true", self._token_span(c[0])), c[0], c[0])

    def false(self, c):
        return self._keep(ast.Ref("false", self._token_span(c[0])), c[0], c[0])

    def dotted(self, c):
        return self._keep(ast.Ref(".".join(c), self._span(c[0], c[-1])), c[0], c[-1])

    def temp(self, c):
        return self._keep(ast.Ref(str(c[0]), self._token_span(c[0])), c[0], c[0])

    def axes(self, c):
        lsqb, names, rsqb = c
        return self._keep(ast.AxesLit(tuple(names or ()), self._span(lsqb, rsqb)), lsqb, rsqb)

    def numbers(self, c):
        lsqb, values, rsqb = c
        return self._keep(ast.NumbersLit(values, self._span(lsqb, rsqb)), lsqb, rsqb)

    def number_list(self, c):
        return tuple(float(str(t)) for t in c)

    def call(self, c):
        callee, args, rpar = c
        pos, kws = args if args is not None else ((), ())
        s = self._span(callee, rpar)
        return self._deep(ast.Call(callee.name, pos, kws, s, callee.span), callee, rpar,
                          [*pos, *(k.value for k in kws)], s)

    def kwarg(self, c):
        name, value = c
        return self._keep(ast.KwArg(str(name), value, self._span(name, value)), name, value, self._extent(value)[4])

    def args(self, c):
        pos = tuple(a for a in c if not isinstance(a, ast.KwArg))
        kws = tuple(a for a in c if isinstance(a, ast.KwArg))
        return (pos, kws)

    # --- types -------------------------------------------------------------
    def axis_list(self, c):
        return tuple(c)

    def type(self, c):
        lsqb, names, placements, rsqb, dtype = c
        axes = tuple((str(t), self._token_span(t)) for t in names or ())
        return ast.TypeAst(axes, str(dtype) if dtype is not None else None,
                           self._span(lsqb, dtype if dtype is not None else rsqb), placements or ())

    def placements(self, c):
        return tuple(c)

    def placement(self, c):
        mesh, kind, axis = c
        return ast.PlacementAst(str(mesh), str(kind), str(axis) if axis is not None else None,
                                self._span(mesh, axis if axis is not None else kind))

    def param(self, c):
        return ast.ParamAst(str(c[0]), c[1], self._token_span(c[0]))

    def params(self, c):
        return tuple(c)

    # --- statements --------------------------------------------------------
    def kind_call(self, c):
        args, kwargs = c[1] if c[1] is not None else ((), ())
        return dict(kind=str(c[0]), args=args, kwargs=kwargs, kind_span=self._token_span(c[0]))

    def stack(self, c):
        out = dict(c[0])
        out["count"] = c[1]
        return out

    def extern(self, c):
        tok = c[0]
        first, *more = c[3] if isinstance(c[3], tuple) else (c[3],)
        contract, terms = c[2] if c[2] is not None else ((), ())
        return dict(kind="extern", args=contract, kwargs=terms,
                    kind_span=Span(self.filename, tok.line or 1, tok.column or 1, (tok.column or 1) + 6),
                    extern_params=c[1] or (), extern_result=first, extern_more=tuple(more))

    def decl(self, c):
        name: ast.Ref = c[0]
        return ast.DeclAst(name=name.name, span=name.span, **c[1])

    def attr(self, c):
        return (str(c[1]), self._span(c[0], c[1]))

    def equation(self, c):
        *heads, value = c
        attrs = [h for h in heads if isinstance(h, tuple)]
        target, *more = [h for h in heads if not isinstance(h, tuple)]
        return ast.EquationAst(str(target), value, tuple(attrs), self._token_span(target),
                               tuple((str(t), self._token_span(t)) for t in more))

    def return_stmt(self, c):
        return ast.ReturnAst(c[1], self._span(c[0], c[-1]), tuple(c[2:]))

    def result_types(self, c):
        return tuple(c)

    def const_def(self, c):
        return ast.ConstAst(str(c[0]), c[1], self._token_span(c[0]))

    def dim_def(self, c):
        return ast.DimAst(str(c[0]), str(c[1]), c[2], self._token_span(c[0]), self._token_span(c[1]))

    def block_def(self, c):
        keyword, name, params, result, *body = c
        first, *more = result if isinstance(result, tuple) else (result,)
        return ast.BlockAst(str(keyword), str(name), params or (), first, tuple(body),
                            self._token_span(name), self._token_span(keyword), tuple(more))

    def start(self, c):
        return c


# one builder serves every parse (lark binds its callbacks once); the lock keeps parses from sharing it
_BUILDER = _ToAst()
_LOCK = threading.Lock()
