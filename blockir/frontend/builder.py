"""Syntax tree → typed IR. Reports every name, argument and type error it finds."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import networkx as nx

from blockir.diagnostics import BlockError, Diagnostic, Note, Span, error
from blockir.frontend import ast
from blockir.frontend.extern_contract import norm_contract
from blockir.frontend.layouts import build_layout
from blockir.frontend.lowering import BlockSignature, Lowerer, role_of, to_const
from blockir.frontend.scope import Scope, suggest
from blockir.ir import consts as C
from blockir.ir.decls import Decl, ExternDecl, InstanceDecl, KindDecl, Param
from blockir.ir.hooks import BUILD
from blockir.ir.identifiers import reserved_declaration
from blockir.ir.kinds import KINDS, ArgSpec, KindSpec
from blockir.ir.program import Block, Const, Program
from blockir.ir.traits import ResidualSum
from blockir.ir.types import Axis, DType, Role, TensorType

MAX_LAYERS = 100_000
ATTRIBUTES = ("inplace",)


class Builder:
    def __init__(self, tree: ast.ProgramAst):
        self.tree = tree
        self.diags: list[Diagnostic] = []
        self.dims: dict[str, Axis] = {}
        self.consts: dict[str, Const] = {}
        self.const_spans: dict[str, Span] = {}
        self.env: dict[str, float | int] = {}
        self.block_asts: dict[str, ast.BlockAst] = {}

    def err(self, code: str, msg: str, span: Span, hint: str | None = None, notes=()) -> None:
        self.diags.append(error(code, msg, span, hint=hint, notes=notes))

    # --- constants -------------------------------------------------------
    def evaluate(self, expr: C.ConstExpr, env: dict[str, float | int] | None = None, report: bool = True):
        try:
            return C.evaluate(expr, self.env if env is None else env)
        except C.ConstError as exc:
            if report:
                self.err("E0113", exc.message, exc.span)
            return None

    def _top_level_name(self, name: str, span: Span, what: str) -> bool:
        first = self.dims[name].span if name in self.dims else self.const_spans.get(name)
        if first is None and name in self.block_asts:
            first = self.block_asts[name].span
        if first is not None or name in C.LAYER_NAMES:
            reason = "is reserved for the layer index and count" if name in C.LAYER_NAMES else "is already defined"
            self.err("E0102", f"{what} '{name}' {reason}", span,
                     notes=[Note("first defined here", first)] if first else [])
            return False
        return True

    def _file_scope(self) -> Scope:
        return Scope(self.dims, dict(self.const_spans), self.diags)

    def dim(self, d: ast.DimAst) -> None:
        role = role_of(d.role)
        if role is None:
            self.err("E0114", f"unknown dim role '{d.role}'", d.role_span,
                     suggest(d.role, [r.value for r in Role]) or "roles: " + ", ".join(r.value for r in Role))
        if not self._top_level_name(d.name, d.span, "dim"):
            return
        size = to_const(d.size, self._file_scope()) if d.size is not None else None
        if size is not None:
            value = self.evaluate(size)
            if value is not None and (not float(value).is_integer() or value <= 0):
                self.err("E0108", f"dim '{d.name}' must be a positive integer, got {value}", d.size.span)
            elif value is not None:
                self.env[d.name] = int(value)
        self.dims[d.name] = Axis(d.name, role or Role.MODEL, size, d.span)

    def const(self, c: ast.ConstAst, scope: Scope | None = None) -> Const | None:
        value = to_const(c.value, scope or self._file_scope())
        if value is None:
            return None
        return Const(c.name, value, c.span)

    # --- types -------------------------------------------------------------
    def type(self, t: ast.TypeAst) -> TensorType | None:
        axes, ok = [], True
        for name, span in t.axes:
            if name in self.dims and self.dims[name].role is Role.MESH:
                self.err("E0111", f"'{name}' is a mesh axis, not a tensor axis", span,
                         f"place the value over it instead: [...; {name}=shard(S)]")
                ok = False
            elif name not in self.dims:
                self.err("E0101", f"undefined dim '{name}'", span, suggest(name, self.dims) or "declare it: dim "
                         f"{name}: seq")
                ok = False
            else:
                axes.append(self.dims[name])
        if not ok:
            return None
        try:
            return TensorType(tuple(axes), DType(t.dtype) if t.dtype else None)
        except ValueError as exc:
            self.err("E0111", str(exc), t.span)
            return None

    # --- declarations ----------------------------------------------------
    def _arg_value(self, spec: ArgSpec, e: ast.Expr, scope: Scope) -> Any:
        word = e.name if isinstance(e, ast.Ref) else None
        if spec.kind == "expr":
            return to_const(e, scope)
        if spec.kind == "int":
            c = to_const(e, scope)
            value = self.evaluate(c) if c is not None else None
            if value is None:
                return None
            if value not in spec.choices:
                self.err("E0107", f"'{spec.name}' must be one of {', '.join(map(str, spec.choices))}, got {value}", e.span)
                return None
            return int(value)
        if spec.kind == "numbers":
            if isinstance(e, ast.NumbersLit):
                return e.values
            self.err("E0107", f"'{spec.name}' must be a list of numbers [a, b, …]", e.span)
            return None
        if spec.kind == "bool":
            if word in ("true", "false"):
                return word == "true"
            self.err("E0107", f"'{spec.name}' must be true or false", e.span)
            return None
        if spec.kind in ("name", "decl"):
            if word is None or word in ("true", "false"):
                self.err("E0107", f"'{spec.name}' must be a parameter name (an identifier, or a dotted path)", e.span)
                return None
            return word
        if spec.kind in ("enum", "dtype"):
            choices = spec.choices if spec.kind == "enum" else tuple(d.value for d in DType)
            if word in choices:
                return word
            self.err("E0107", f"'{spec.name}' must be one of {', '.join(choices)}", e.span, suggest(word or "", choices))
            return None
        names = e.names if isinstance(e, ast.AxesLit) and spec.kind == "axes" else (word,) if word else None
        if names is None:
            self.err("E0107", f"'{spec.name}' must name a dim" + (" or a list [A, B]" if spec.kind == "axes" else ""),
                     e.span)
            return None
        for n in names:
            if n not in self.dims:
                self.err("E0101", f"undefined dim '{n}'", e.span, suggest(n, self.dims))
                return None
        return names if spec.kind == "axes" else names[0]

    def kind_decl(self, d: ast.DeclAst, spec: KindSpec, scope: Scope) -> KindDecl | None:
        values: dict[str, Any] = {}
        ok = True
        positional = spec.positional
        if len(d.args) > len(positional):
            self.err("E0106", f"'{spec.name}' takes {len(positional)} positional argument"
                     f"{'s' if len(positional) != 1 else ''}, got {len(d.args)}", d.args[len(positional)].span,
                     "pass the others by keyword: " + ", ".join(a.name + "=…" for a in spec.args if not a.positional))
            ok = False
        for aspec, e in zip(positional, d.args):
            values[aspec.name] = (self._arg_value(aspec, e, scope), e.span)
        for kw in d.kwargs:
            aspec = spec.arg(kw.name)
            if aspec is None:
                self.err("E0104", f"unknown keyword argument '{kw.name}' for {spec.name}", kw.span,
                         suggest(kw.name, [a.name for a in spec.args]) or
                         "accepted: " + ", ".join(a.name for a in spec.args))
                ok = False
            elif kw.name in values:
                self.err("E0102", f"argument '{kw.name}' is given twice", kw.span)
                ok = False
            else:
                values[kw.name] = (self._arg_value(aspec, kw.value, scope), kw.value.span)
        ok = self._implications(spec, values, d.kind_span) and ok
        args = []
        for aspec in spec.args:
            if aspec.name in values:
                value, span = values[aspec.name]
                if value is None:
                    ok = False
                    continue
                if aspec.name == "eps":
                    v = self.evaluate(value)
                    if v is not None and v <= 0:
                        self.err("E0110", f"eps must be > 0, got {v}", span, "eps keeps the square root away from zero")
                        ok = False
                args.append((aspec.name, value))
            elif aspec.required:
                self.err("E0105", f"{spec.name} needs argument '{aspec.name}'", d.kind_span,
                         f"{spec.name}({aspec.name}=…)" if not aspec.positional else aspec.doc or None)
                ok = False
            elif aspec.default is not None:
                args.append((aspec.name, aspec.default))
        return KindDecl(d.name, spec.name, tuple(args), d.span) if ok else None

    def _implications(self, spec: KindSpec, values: dict[str, tuple[Any, Span]], kind_span: Span) -> bool:
        """Apply the kind's implications to ``values`` (given arguments): a default that follows is filled
        in, a given value that contradicts is reported. False when something was reported."""
        ok = True
        for rule in spec.implies:
            given = values.get(rule.when)
            when = given[0] if given is not None else spec.arg(rule.when).default  # type: ignore[union-attr]
            if when != rule.given:
                continue
            if rule.arg not in values:
                if rule.value is not None:  # an implied "unset" leaves the argument out, as its default does
                    values[rule.arg] = (rule.value, kind_span)
            elif values[rule.arg][0] is not None and values[rule.arg][0] != rule.value:
                shown = "true" if rule.given is True else "false" if rule.given is False else str(rule.given)
                notes = [Note(f"{rule.when}={shown} given here", given[1])] if given is not None else []
                self.err("E0119", f"'{rule.arg}' contradicts {rule.when}={shown}: {rule.reason}", values[rule.arg][1],
                         notes=notes, hint=f"remove '{rule.arg}'" + (" or change '{0}'" if given else " or set {0}={1}").format(
                             rule.when, "false" if rule.given else "true"))
                ok = False
        return ok

    def decl(self, d: ast.DeclAst, scope: Scope) -> Decl | None:
        if d.kind == "extern":
            params = [self._param(p) for p in d.extern_params or ()]
            result = self.type(d.extern_result) if d.extern_result else None
            layout = build_layout(d.extern_result, result, self.dims, self.err) if d.extern_result else None
            more = [self.type(t) for t in d.extern_more]
            if result is None or layout is None or any(p is None for p in params) or any(t is None for t in more):
                return None
            contract = norm_contract(self, d, scope, params, [result, *more])  # type: ignore[arg-type, list-item]
            if contract is False:
                return None
            if more and contract is None:
                self.err("E0454", f"extern '{d.name}' returns {1 + len(more)} results but states no contract: only "
                         "a fused add+norm returns several", d.kind_span,
                         hint="state what it computes: extern(x: …, residual: …; norm=rmsnorm(D), residual=1)")
                return None
            return ExternDecl(d.name, tuple(params), result, d.span, layout, tuple(more),  # type: ignore[arg-type]
                              contract or None)
        if d.kind in self.block_asts:
            if d.args or d.kwargs:
                self.err("E0106", f"block '{d.kind}' takes no arguments", d.kind_span)
                return None
            count = None
            if d.count is not None:
                count = to_const(d.count, scope)
                if count is None:
                    return None
                n = self.evaluate(count)
                if n is None:
                    return None
                if not float(n).is_integer() or n < 1:
                    self.err("E0108", f"layer count must be a positive integer, got {n}", d.count.span)
                    return None
                if n > MAX_LAYERS:
                    self.err("E0116", f"a stack of {int(n)} layers exceeds the limit of {MAX_LAYERS}", d.count.span)
                    return None
            return InstanceDecl(d.name, d.kind, count, d.span)
        spec = KINDS.get(d.kind)
        if spec is None:
            self.err("E0112", f"unknown kind '{d.kind}'", d.kind_span,
                     suggest(d.kind, [*KINDS, *self.block_asts, "extern"]) or "kinds: " + ", ".join(KINDS))
            return None
        if d.count is not None:
            self.err("E0111", f"only blocks can be stacked; '{d.kind}' is a built-in kind", d.count.span)
            return None
        return self.kind_decl(d, spec, scope)

    def _param(self, p: ast.ParamAst) -> Param | None:
        t = self.type(p.type)
        layout = build_layout(p.type, t, self.dims, self.err)
        return Param(p.name, t, p.span, layout) if t is not None and layout is not None else None

    # --- blocks ----------------------------------------------------------
    def signature(self, b: ast.BlockAst) -> BlockSignature | None:
        params = [self.type(p.type) for p in b.params]
        result = self.type(b.result)
        more = [self.type(t) for t in b.more_results]
        if result is None or any(p is None for p in (*params, *more)):
            return None
        return BlockSignature(tuple(params), result, tuple(more))  # type: ignore[arg-type]

    def block(self, b: ast.BlockAst, signatures: dict[str, BlockSignature]) -> Block | None:
        errors_before = sum(d.is_error for d in self.diags)
        scope = Scope(self.dims, dict(self.const_spans), self.diags)
        sig = signatures.get(b.name)
        params: list[Param] = []
        inputs = []
        for p, t in zip(b.params, sig.params if sig else [None] * len(b.params)):
            if not scope.define(p.name, p.span, "input"):
                continue
            if t is None:
                scope.poisoned.add(p.name)
                continue
            scope.values[p.name] = t
            layout = build_layout(p.type, t, self.dims, self.err)
            params.append(Param(p.name, t, p.span, layout or ()))
            inputs.append(BUILD.of("parameter")(None, p.name, p.span, t))
        env = dict(self.env, **{C.LAYER: 0, C.NUM_LAYERS: 1})
        consts = []
        for s in b.body:
            if isinstance(s, ast.ConstAst) and scope.define(s.name, s.span, "const"):
                scope.consts[s.name] = s.span
                c = self.const(s, scope)
                if c is not None:
                    consts.append(c)
                    value = self.evaluate(c.value, env)
                    if value is not None:
                        env[c.name] = value
        decls = []
        for s in b.body:
            if isinstance(s, ast.DeclAst) and scope.define(s.name, s.span, "declaration"):
                why = reserved_declaration(s.name)
                if why is not None:
                    self.err("E0102", f"declaration '{s.name}' {why}", s.span,
                             "a declaration becomes a submodule at its name, and this one cannot; rename it "
                             "(and the checkpoint keys under it)")
                    scope.poisoned.add(s.name)
                    continue
                d = self.decl(s, scope)
                if d is not None:
                    scope.decls[s.name] = d
                    decls.append(d)
                else:
                    scope.poisoned.add(s.name)
        self._references(decls, scope)
        lower = Lowerer(scope, signatures, lambda e: self.evaluate(e, env, report=True))
        lower.ops.extend(inputs)
        lower.reserved = {t for s in b.body if isinstance(s, ast.EquationAst)
                          for t in (s.target, *(n for n, _ in s.more_targets))}
        returns = [s for s in b.body if isinstance(s, ast.ReturnAst)]
        for s in b.body:
            if isinstance(s, ast.EquationAst):
                self._equation(s, scope, lower)
        output = None
        if not returns:
            self.err("E0117", f"{b.keyword} '{b.name}' has no return statement", b.span, "end the body with: return y")
        for extra in returns[1:]:
            self.err("E0117", "a block returns exactly once", extra.span, notes=[Note("first return", returns[0].span)])
        if returns:
            ret = returns[0]
            values = [lower.tensor(e) for e in (ret.value, *ret.more)]
            declared = 1 + len(sig.more) if sig else len(values)
            if len(values) != declared:
                self.err("E0421", f"{b.keyword} '{b.name}' returns {len(values)} value{'s' if len(values) > 1 else ''} "
                         f"but declares {declared}", ret.span, notes=[Note("declared here", b.span)],
                         hint="return the hidden state first, then each carried stream in declared order")
            elif all(v is not None for v in values):
                output = BUILD.of("return")(lower, None, ret.span, tuple(values))
        result_layout = build_layout(b.result, sig.result if sig else None, self.dims, self.err)
        if sum(d.is_error for d in self.diags) > errors_before or sig is None or output is None:
            return None
        return Block(b.name, b.keyword, tuple(params), sig.result, tuple(consts), tuple(decls),
                     tuple(lower.ops) + (output,), b.span, result_layout or (), sig.more)

    def _references(self, decls: list[Decl], scope: Scope) -> None:
        """Arguments that name another declaration of the block name one of the categories they accept."""
        for d in decls:
            if not isinstance(d, KindDecl):
                continue
            for aspec in d.spec.args:
                target = d.arg(aspec.name) if aspec.kind == "decl" else None
                if target is None or target in scope.poisoned:
                    continue
                other = scope.decls.get(target)
                if other is None or other.category not in aspec.choices:
                    what = "names no declaration of this block" if other is None else \
                        f"names '{target}', a {other.category} declaration"
                    kinds = " or ".join(k for k, spec in KINDS.items() if spec.category in aspec.choices)
                    self.err("E0126", f"'{aspec.name}' of '{d.name}' {what}", d.span,
                             (suggest(target, scope.decls) if other is None else None) or f"name a {kinds} declaration")

    def _equation(self, s: ast.EquationAst, scope: Scope, lower: Lowerer) -> None:
        inplace = False
        for attr, span in s.attrs:
            if attr not in ATTRIBUTES:
                self.err("E0115", f"unknown attribute '@{attr}'", span, suggest(attr, ATTRIBUTES) or "attributes: @inplace")
            elif not (isinstance(s.value, ast.BinOp) and s.value.op == "+"):
                self.err("E0115", "@inplace applies to a residual add 'a + b'", span)
            else:
                inplace = True
        defined = [scope.define(n, span, "value") for n, span in ((s.target, s.span), *s.more_targets)]
        if not all(defined):
            lower.tensor(s.value)
            return
        before = len(lower.ops)
        lower.more_targets = tuple(n for n, _ in s.more_targets)
        result = lower.tensor(s.value, s.target)
        if lower.more_targets:  # no call took the further names
            self.err("E0421", f"only a call can bind several names; '{s.target}' takes the only value", s.span,
                     "bind several names to a block that declares several results: y, s = layers(x, s0)")
            lower.more_targets = ()
            result = None
        if result is None:
            scope.poisoned.update((s.target, *(n for n, _ in s.more_targets)))
        elif inplace and len(lower.ops) > before:
            op = lower.ops[-1]
            if op.has(ResidualSum):  # the statement's own add, not a bias the '+' turned out to add
                lower.ops[-1] = replace(op, inplace=True)

    # --- program -----------------------------------------------------------
    def build(self) -> Program:
        blocks_ast = []
        for item in self.tree.items:
            if isinstance(item, ast.DimAst):
                self.dim(item)
            elif isinstance(item, ast.ConstAst):
                if self._top_level_name(item.name, item.span, "const"):
                    c = self.const(item)
                    self.const_spans[item.name] = item.span
                    if c is not None:
                        self.consts[item.name] = c
                        v = self.evaluate(c.value)
                        if v is not None:
                            self.env[item.name] = v
            else:
                if item.keyword not in ("block", "model"):
                    self.err("E0001", f"unexpected name '{item.keyword}'; expected 'block', 'model', 'dim' or 'const'",
                             item.keyword_span)
                elif self._top_level_name(item.name, item.span, item.keyword):
                    self.block_asts[item.name] = item
                    blocks_ast.append(item)
        signatures = {b.name: s for b in blocks_ast if (s := self.signature(b)) is not None}
        self._check_cycles(blocks_ast)
        blocks = [self.block(b, signatures) for b in blocks_ast]
        errors = [d for d in self.diags if d.is_error]
        if errors:
            raise BlockError(self.diags)
        dropped = [b.name for b, built in zip(blocks_ast, blocks) if built is None]
        if dropped:
            # a block is only left out after a reported error; leaving one out silently would compile a program
            # without it
            raise RuntimeError(f"blocks {dropped} were not built, and no diagnostic says why")
        return Program(self.tree.filename, tuple(self.dims.values()), tuple(self.consts.values()),
                       tuple(b for b in blocks if b is not None))

    def _check_cycles(self, blocks: list[ast.BlockAst]) -> None:
        g = nx.DiGraph()
        spans: dict[tuple[str, str], Span] = {}
        for b in blocks:
            g.add_node(b.name)
            for s in b.body:
                if isinstance(s, ast.DeclAst) and s.kind in self.block_asts:
                    g.add_edge(b.name, s.kind)
                    spans.setdefault((b.name, s.kind), s.kind_span)
        order = {b.name: i for i, b in enumerate(blocks)}
        # one report per strongly connected group (enumerating every cycle is exponential), showing
        # the cycle found from the group's first block in the file
        groups = [c for c in nx.strongly_connected_components(g)
                  if len(c) > 1 or any(g.has_edge(n, n) for n in c)]
        for group in sorted(groups, key=lambda c: min(order[n] for n in c)):
            first = min(group, key=order.__getitem__)
            edges = nx.find_cycle(g.subgraph(group), first)
            cycle = [u for u, _ in edges]
            edge = edges[0]
            path = " -> ".join(cycle + [cycle[0]])
            self.err("E0118", f"blocks instantiate each other in a cycle: {path}", spans[edge],
                     "a block cannot contain itself, directly or through others")


def build(tree: ast.ProgramAst) -> Program:
    return Builder(tree).build()
