"""Text → syntax tree. The only module that touches lark; its errors become diagnostics."""
from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError
from lark.visitors import Transformer_NonRecursive

from blockir.diagnostics import BlockError, Diagnostic, Span, error
from blockir.grammar import ast
from blockir.grammar.cache import cached_lark

MAX_BYTES = 1 << 20
MAX_NESTING = 64
MAX_EXPR_DEPTH = 256
MAX_EXPECTED_SHOWN = 8

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
    grammar = resources.files("blockir.grammar").joinpath("block.lark").read_text()
    return cached_lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _token_label(name: str) -> str:
    if name in TOKEN_NAMES:
        return TOKEN_NAMES[name]
    try:
        pattern = _lark().get_terminal(name).pattern
    except KeyError:
        return name
    return f"'{pattern.value}'" if pattern.type == "str" else name.lower()


def _expected(names: set[str]) -> str:
    labels = sorted({_token_label(n) for n in names})
    shown = labels[:MAX_EXPECTED_SHOWN]
    more = f", … ({len(labels) - len(shown)} more)" if len(labels) > len(shown) else ""
    return ", ".join(shown) + more


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
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as exc:
        raise BlockError([_syntax_diagnostic(exc, filename, text)], {filename: text}) from None
    builder = _ToAst(filename)
    try:
        items = builder.transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, _DepthError):
            raise BlockError([exc.orig_exc.diagnostic], {filename: text}) from None
        raise
    return ast.ProgramAst(filename, tuple(items))


class _DepthError(Exception):
    def __init__(self, diagnostic: Diagnostic):
        self.diagnostic = diagnostic


def _span(filename: str, node: Tree | Token) -> Span:
    if isinstance(node, Token):
        return Span(filename, node.line or 1, node.column or 1,
                    (node.end_column if node.end_line == node.line else None))
    meta = node.meta
    if getattr(meta, "empty", True):
        return Span(filename, 1, 1)
    end = meta.end_column if meta.end_line == meta.line else None
    return Span(filename, meta.line, meta.column, end)


def _depth(e: Any) -> int:
    return getattr(e, "_depth", 1)


class _ToAst(Transformer_NonRecursive):
    """Builds ast nodes bottom-up without recursion, bounding expression depth."""

    def __init__(self, filename: str):
        super().__init__(visit_tokens=False)
        self.filename = filename
        self.depths: dict[int, int] = {}

    # --- expressions -----------------------------------------------------
    def _deep(self, node: Any, children: list[Any], tree_span: Span) -> Any:
        d = 1 + max((self.depths.get(id(c), 1) for c in children), default=0)
        if d > MAX_EXPR_DEPTH:
            raise _DepthError(error("E0005", f"expression nests deeper than {MAX_EXPR_DEPTH} operations", tree_span,
                                    hint="name intermediate values instead of chaining"))
        self.depths[id(node)] = d
        return node

    def _binop(self, op: str, meta_tree: Tree, children: list[Any]) -> ast.BinOp:
        s = _span(self.filename, meta_tree)
        return self._deep(ast.BinOp(op, children[0], children[1], s), children, s)

    def __default__(self, data: str, children: list[Any], meta: Any) -> Any:  # pragma: no cover - grammar is closed
        raise AssertionError(f"unhandled rule {data}")

    def _tree(self, meta: Any) -> Tree:
        return Tree("x", [], meta)

    from lark import v_args as _v

    @_v(meta=True)
    def add(self, meta, c):
        return self._binop("+", self._tree(meta), c)

    @_v(meta=True)
    def sub(self, meta, c):
        return self._binop("-", self._tree(meta), c)

    @_v(meta=True)
    def mul(self, meta, c):
        return self._binop("*", self._tree(meta), c)

    @_v(meta=True)
    def div(self, meta, c):
        return self._binop("/", self._tree(meta), c)

    @_v(meta=True)
    def pow(self, meta, c):
        return self._binop("**", self._tree(meta), c)

    @_v(meta=True)
    def neg(self, meta, c):
        s = _span(self.filename, self._tree(meta))
        return self._deep(ast.Neg(c[0], s), c, s)

    @_v(meta=True)
    def number(self, meta, c):
        text = str(c[0])
        value: int | float = int(text) if text.isdigit() else float(text)
        return ast.Num(value, _span(self.filename, c[0]))

    @_v(meta=True)
    def true(self, meta, c):
        return ast.Ref("true", _span(self.filename, self._tree(meta)))

    @_v(meta=True)
    def false(self, meta, c):
        return ast.Ref("false", _span(self.filename, self._tree(meta)))

    @_v(meta=True)
    def dotted(self, meta, c):
        return ast.Ref(".".join(str(t) for t in c), _span(self.filename, self._tree(meta)))

    @_v(meta=True)
    def temp(self, meta, c):
        return ast.Ref(str(c[0]), _span(self.filename, c[0]))

    @_v(meta=True)
    def axes(self, meta, c):
        names = tuple(str(t) for t in c[0].children) if c[0] is not None else ()
        return ast.AxesLit(names, _span(self.filename, self._tree(meta)))

    @_v(meta=True)
    def call(self, meta, c):
        callee: ast.Ref = c[0]
        args, kwargs = c[1] if c[1] is not None else ((), ())
        s = _span(self.filename, self._tree(meta))
        return self._deep(ast.Call(callee.name, args, kwargs, s, callee.span), [*args, *(k.value for k in kwargs)], s)

    @_v(meta=True)
    def kwarg(self, meta, c):
        return ast.KwArg(str(c[0]), c[1], _span(self.filename, self._tree(meta)))

    def args(self, c):
        pos = tuple(a for a in c if not isinstance(a, ast.KwArg))
        kws = tuple(a for a in c if isinstance(a, ast.KwArg))
        return (pos, kws)

    # --- types -------------------------------------------------------------
    def axis_list(self, c):
        return Tree("axis_list", c)

    @_v(meta=True)
    def type(self, meta, c):
        axes = tuple((str(t), _span(self.filename, t)) for t in c[0].children) if c[0] is not None else ()
        dtype = str(c[2]) if c[2] is not None else None
        return ast.TypeAst(axes, dtype, _span(self.filename, self._tree(meta)), c[1] or ())

    def placements(self, c):
        return tuple(c)

    @_v(meta=True)
    def placement(self, meta, c):
        return ast.PlacementAst(str(c[0]), str(c[1]), str(c[2]) if c[2] is not None else None,
                                _span(self.filename, self._tree(meta)))

    @_v(meta=True)
    def param(self, meta, c):
        return ast.ParamAst(str(c[0]), c[1], _span(self.filename, c[0]))

    def params(self, c):
        return tuple(c)

    # --- statements --------------------------------------------------------
    @_v(meta=True)
    def kind_call(self, meta, c):
        args, kwargs = c[1] if c[1] is not None else ((), ())
        return dict(kind=str(c[0]), args=args, kwargs=kwargs, kind_span=_span(self.filename, c[0]))

    @_v(meta=True)
    def stack(self, meta, c):
        out = dict(c[0])
        out["count"] = c[1]
        return out

    @_v(meta=True)
    def extern(self, meta, c):
        s = _span(self.filename, self._tree(meta))
        return dict(kind="extern", args=(), kwargs=(), kind_span=Span(s.filename, s.line, s.column, s.column + 6),
                    extern_params=c[0] or (), extern_result=c[1])

    @_v(meta=True)
    def decl(self, meta, c):
        name: ast.Ref = c[0]
        return ast.DeclAst(name=name.name, span=name.span, **c[1])

    @_v(meta=True)
    def attr(self, meta, c):
        return (str(c[0]), _span(self.filename, self._tree(meta)))

    @_v(meta=True)
    def equation(self, meta, c):
        *attrs, target, value = c
        return ast.EquationAst(str(target), value, tuple(attrs), _span(self.filename, target))

    @_v(meta=True)
    def return_stmt(self, meta, c):
        return ast.ReturnAst(c[0], _span(self.filename, self._tree(meta)))

    @_v(meta=True)
    def const_def(self, meta, c):
        return ast.ConstAst(str(c[0]), c[1], _span(self.filename, c[0]))

    @_v(meta=True)
    def dim_def(self, meta, c):
        return ast.DimAst(str(c[0]), str(c[1]), c[2], _span(self.filename, c[0]), _span(self.filename, c[1]))

    @_v(meta=True)
    def block_def(self, meta, c):
        keyword, name, params, result, *body = c
        return ast.BlockAst(str(keyword), str(name), params or (), result, tuple(body),
                            _span(self.filename, name), _span(self.filename, keyword))

    def start(self, c):
        return c
