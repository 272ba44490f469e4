"""Syntax-tree expressions → constant expressions and SSA ops, with type inference.

This module checks the syntax of each construct and lowers its operands; which op a checked construct
becomes is the kind's own ``BUILD`` hook (``blockir/ops/<kind>.py``), looked up by the construct.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from blockir.diagnostics import Span, error
from blockir.frontend import ast
from blockir.frontend.scope import Scope, builtin_functions, kind_functions, suggest
from blockir.ir import consts as C
from blockir.ir.decls import ExternDecl, InstanceDecl, KindDecl
from blockir.ir.hooks import BUILD
from blockir.ir.kinds import ACTIVATIONS, FUNCTIONS, GATES, MASKS
from blockir.ir.types import DType, Role, TensorType
from blockir.ops import Op

TENSOR_OPS_HINT = ("tensors combine with '+' (an add, or a learned bias), '*' (a scaling or an elementwise product), "
                   "'-' (the difference of two tensors) and '1 - z' only")


def to_const(e: ast.Expr, scope: Scope) -> C.ConstExpr | None:
    """Convert an expression that must be constant; report tensors and unknown names."""
    if isinstance(e, ast.Num):
        if isinstance(e.value, float) and not math.isfinite(e.value):
            scope.diags.append(error("E0113", "number is too large for a float", e.span))
            return None
        return C.Num(e.value, e.span)
    if isinstance(e, ast.Ref):
        if scope.is_constant(e.name):
            return C.Name(e.name, e.span)
        if e.name in scope.values or e.name in scope.decls:
            scope.diags.append(error("E0111", f"'{e.name}' is not a constant", e.span,
                                     hint="constant expressions use numbers, dims, consts, layer and num_layers"))
        else:
            scope.undefined(e.name, e.span)
        return None
    if isinstance(e, ast.Neg):
        inner = to_const(e.operand, scope)
        return C.Neg(inner, e.span) if inner is not None else None
    if isinstance(e, ast.BinOp):
        left, right = to_const(e.left, scope), to_const(e.right, scope)
        return C.Bin(e.op, left, right, e.span) if left is not None and right is not None else None
    scope.diags.append(error("E0111", "expected a constant expression", e.span))
    return None


def is_constant_expr(e: ast.Expr, scope: Scope) -> bool:
    if isinstance(e, ast.Num):
        return True
    if isinstance(e, ast.Ref):
        return scope.is_constant(e.name)
    if isinstance(e, ast.Neg):
        return is_constant_expr(e.operand, scope)
    if isinstance(e, ast.BinOp):
        return is_constant_expr(e.left, scope) and is_constant_expr(e.right, scope)
    return False


@dataclass
class BlockSignature:
    """The types a block takes and returns, as a call sees them."""

    params: tuple[TensorType, ...]
    result: TensorType
    more: tuple[TensorType, ...] = ()


@dataclass
class Lowerer:
    """Turns the equations of one block into ops, appending to ``ops``."""

    scope: Scope
    signatures: dict[str, BlockSignature]
    env: Callable[[C.ConstExpr], float | int | None]
    ops: list[Op] = field(default_factory=list)
    reserved: set[str] = field(default_factory=set)
    counter: int = 0
    more_targets: tuple[str, ...] = ()  # the further names of `y, s = call(…)`, taken by the outermost call

    def fresh(self) -> str:
        while f"%{self.counter}" in self.reserved:
            self.counter += 1
        name = f"%{self.counter}"
        self.counter += 1
        return name

    def emit(self, op: Op) -> str:
        self.ops.append(op)
        for r in op.results:
            self.scope.values[r] = op.type_of(r)
        return op.result

    def type_of(self, value: str) -> TensorType:
        return self.scope.values[value]

    def build(self, construct: str, name: str | None, span: Span, *args: Any, **kw: Any) -> str | None:
        """Emit the op ``construct`` becomes (its kind's ``BUILD`` hook), named ``name`` or a fresh temporary."""
        op = BUILD.of(construct)(self, name or self.fresh(), span, *args, **kw)
        return self.emit(op) if op is not None else None

    def _results(self, e: ast.Call, returns: tuple[TensorType, ...], more: tuple[str, ...]) -> bool:
        """Whether a call that returns ``1 + len(returns)`` values is bound to as many names."""
        if len(more) == len(returns):
            return True
        if returns:
            self.err("E0421", f"'{e.callee}' returns {1 + len(returns)} values, bound to {1 + len(more)} "
                     f"name{'s' if more else ''}", e.span,
                     "name each result: " + ", ".join(["y", *(f"s{i + 1}" for i in range(len(returns)))]) +
                     f" = {e.callee}(…)")
        else:
            self.err("E0421", f"'{e.callee}' returns one value, bound to {1 + len(more)} names", e.span,
                     "only a block that declares several results, or an attention with score_residual, returns "
                     "several values")
        return False

    def err(self, code: str, msg: str, span: Span, hint: str | None = None) -> None:
        self.scope.diags.append(error(code, msg, span, hint=hint))

    # ---------------------------------------------------------------------
    def tensor(self, e: ast.Expr, name: str | None = None) -> str | None:
        """Lower a tensor expression; ``name`` names its top-level result."""
        if isinstance(e, ast.Ref):
            return self._ref(e, name)
        if isinstance(e, ast.BinOp) and e.op == "+":
            return self._add(e, name)
        if isinstance(e, ast.BinOp) and e.op == "*":
            return self._mul(e, name)
        if isinstance(e, ast.BinOp) and e.op == "-" and is_constant_expr(e.left, self.scope) \
                and not is_constant_expr(e.right, self.scope):
            return self._complement(e, name)
        if isinstance(e, ast.BinOp) and e.op == "-" and not is_constant_expr(e.left, self.scope):
            return self._sub(e, name)
        if isinstance(e, ast.Call):
            return self._call(e, name)
        what = {ast.Num: "a number", ast.AxesLit: "an axis list", ast.NumbersLit: "a list of numbers"}.get(type(e), f"'{getattr(e, 'op', '-')}'")
        if isinstance(e, (ast.BinOp, ast.Neg)):
            self.err("E0111", f"{what} does not apply to tensors", e.span, TENSOR_OPS_HINT)
        else:
            self.err("E0111", f"expected a tensor, found {what}", e.span, TENSOR_OPS_HINT)
        return None

    def _ref(self, e: ast.Ref, name: str | None) -> str | None:
        if e.name in self.scope.poisoned:
            return None
        if e.name in self.scope.values:
            if name is None:
                return e.name
            self.err("E0111", f"'{name}' would only rename '{e.name}'", e.span,
                     "use the existing value directly; SSA names are not aliases")
            return None
        if e.name in self.scope.decls:
            category = self.scope.decls[e.name].category
            self.err("E0111", f"'{e.name}' is a declaration, not a value", e.span,
                     {"scale": f"multiply by it: {e.name} * x", "shift": f"add it to a tensor: x + {e.name}"}.get(
                         category, f"apply it to a tensor: {e.name}(x)"))
        elif self.scope.is_constant(e.name):
            self.err("E0111", f"'{e.name}' is a constant, not a tensor", e.span, f"scale a tensor with it: {e.name} * x")
        else:
            self.scope.undefined(e.name, e.span, "value")
        return None

    def _bias(self, e: ast.Expr) -> str | None:
        """The name of a learned ``bias`` declaration written as one side of '+'."""
        if isinstance(e, ast.Ref) and isinstance(self.scope.decls.get(e.name), KindDecl) \
                and self.scope.decls[e.name].category == "shift":
            return e.name
        return None

    def _add(self, e: ast.BinOp, name: str | None) -> str | None:
        lb, rb = self._bias(e.left), self._bias(e.right)
        if lb is not None and rb is not None:
            self.err("E0111", "a sum of two biases is not a tensor", e.span, "add a bias to a tensor: x + b")
            return None
        if lb is not None or rb is not None:
            operand = self.tensor(e.right if lb is not None else e.left)
            if operand is None:
                return None
            return self.build("x + bias", name, e.span, operand, lb or rb)
        lhs, rhs = self.tensor(e.left), self.tensor(e.right)
        if lhs is None or rhs is None:
            return None
        return self.build("a + b", name, e.span, lhs, rhs)

    def _factor(self, e: ast.Expr) -> tuple[C.ConstExpr | None, str | None] | None:
        if isinstance(e, ast.Ref) and isinstance(self.scope.decls.get(e.name), KindDecl) \
                and self.scope.decls[e.name].category == "scale":
            return (None, e.name)
        if is_constant_expr(e, self.scope):
            c = to_const(e, self.scope)
            return (c, None) if c is not None else None
        return None

    def _mul(self, e: ast.BinOp, name: str | None) -> str | None:
        if any(isinstance(side, ast.Ref) and side.name in self.scope.poisoned for side in (e.left, e.right)):
            return None
        lf, rf = self._factor(e.left), self._factor(e.right)
        if lf is not None and rf is not None:
            self.err("E0111", "a product of constants is not a tensor", e.span, "compute it as a const")
            return None
        if lf is None and rf is None:
            lhs, rhs = self.tensor(e.left), self.tensor(e.right)
            if lhs is None or rhs is None:
                return None
            return self.build("a * b", name, e.span, lhs, rhs)
        factor, tensor_side = (lf, e.right) if lf is not None else (rf, e.left)
        operand = self.tensor(tensor_side)
        if operand is None:
            return None
        return self.build("s * x", name, e.span, operand, factor[0], factor[1])

    def _complement(self, e: ast.BinOp, name: str | None) -> str | None:
        one = to_const(e.left, self.scope)
        if one is None:
            return None
        if self.env(one) != 1:
            self.err("E0111", "only '1 - z' subtracts a tensor", e.left.span,
                     "write the complementary gate as 1 - z; scale it with '*' if needed")
            return None
        operand = self.tensor(e.right)
        if operand is None:
            return None
        return self.build("1 - z", name, e.span, operand)

    def _sub(self, e: ast.BinOp, name: str | None) -> str | None:
        lhs, rhs = self.tensor(e.left), self.tensor(e.right)
        if lhs is None or rhs is None:
            return None
        return self.build("a - b", name, e.span, lhs, rhs)

    # --- calls -----------------------------------------------------------
    def _args(self, e: ast.Call, arity: int | None, kwargs_ok: tuple[str, ...] = ()) -> list[str] | None:
        ok = True
        if arity is not None and len(e.args) != arity:
            self.err("E0106", f"'{e.callee}' takes {arity} tensor argument{'s' if arity != 1 else ''}, "
                     f"got {len(e.args)}", e.span)
            ok = False
        for kw in e.kwargs:
            if kw.name not in kwargs_ok:
                hint = suggest(kw.name, kwargs_ok) or (f"'{e.callee}' takes no keyword arguments" if not kwargs_ok
                                                       else "accepted: " + ", ".join(kwargs_ok))
                self.err("E0104", f"unknown keyword argument '{kw.name}' for '{e.callee}'", kw.span, hint)
                ok = False
        values = [self.tensor(a) for a in e.args]
        if not ok or any(v is None for v in values):
            return None
        return values  # type: ignore[return-value]

    def _call(self, e: ast.Call, name: str | None) -> str | None:
        more, self.more_targets = self.more_targets, ()
        decl = self.scope.decls.get(e.callee)
        if isinstance(decl, InstanceDecl) or isinstance(decl, KindDecl) and decl.arg("score_residual") is not None \
                or isinstance(decl, ExternDecl) and decl.more:
            return self._call_results(e, decl, name, more)
        if more and e.callee not in self.scope.poisoned:  # a declaration that failed has no result count
            self._results(e, (), more)
            for a in e.args:  # errors inside the arguments are still worth reporting
                self.tensor(a)
            return None
        if e.callee in self.scope.poisoned:
            for a in e.args:  # errors inside the arguments are still worth reporting
                self.tensor(a)
            return None
        decl = self.scope.decls.get(e.callee)
        if decl is not None:
            return self._call_decl(e, decl, name)
        if e.callee in FUNCTIONS:
            return self._call_function(e, name)
        if e.callee in kind_functions():
            return self._call_kind_function(e, name)
        self.scope.diags.append(error("E0101", f"undefined function or declaration '{e.callee}'", e.callee_span,
                                      hint=suggest(e.callee, [*self.scope.decls, *builtin_functions()])))
        for a in e.args:  # still report errors inside the arguments
            self.tensor(a)
        return None

    def _call_results(self, e: ast.Call, decl: InstanceDecl | KindDecl | ExternDecl, name: str | None,
                      more: tuple[str, ...]) -> str | None:
        """A call that may return carried streams after its hidden state: a block, a stack, a score attention,
        an extern declaring several results."""
        if isinstance(decl, ExternDecl):
            args = self._args(e, len(decl.params))
            if args is None or not self._results(e, decl.more, more):
                return None
            dtype = self.scope.values[args[0]].dtype if args else None
            t, *rest = (r if r.dtype is not None else r.with_dtype(dtype) for r in (decl.result, *decl.more))
            if decl.contract is not None:
                return self.build("extern_add_norm(u, x)", name, e.span, decl.name, tuple(args),
                                  (name, *more), t, decl.contract.residual)
            return self.build("decl(x)", name, e.span, decl.name, tuple(args), t, more, tuple(rest))
        if isinstance(decl, InstanceDecl):
            sig = self.signatures.get(decl.block)
            args = self._args(e, len(sig.params) if sig else None)
            if sig is None or not self._results(e, sig.more, more) or args is None:
                return None
            return self.build("decl(x)", name, e.span, decl.name, tuple(args), sig.result, more, sig.more)
        args = self._args(e, 3 if decl.kind == "cross_attention" else 2)
        if args is None:
            return None
        scores = self.scope.values[args[-1]]
        if not self._results(e, (scores,), more):
            return None
        return self.build("decl(x)", name, e.span, decl.name, tuple(args), self.scope.values[args[0]], more,
                          (scores,))

    def _call_decl(self, e: ast.Call, decl, name: str | None) -> str | None:
        if isinstance(decl, KindDecl) and decl.category == "scale":
            self.err("E0111", f"'{e.callee}' is a learned scale, not a function", e.callee_span,
                     f"multiply by it: {e.callee} * x")
            return None
        if isinstance(decl, KindDecl) and decl.category == "shift":
            self.err("E0111", f"'{e.callee}' is a learned bias, not a function", e.callee_span,
                     f"add it to a tensor: x + {e.callee}")
            return None
        if isinstance(decl, ExternDecl):
            args = self._args(e, len(decl.params))
            if args is None:
                return None
            t = decl.result
            if t.dtype is None:
                t = t.with_dtype(self.scope.values[args[0]].dtype if args else None)
            return self.build("decl(x)", name, e.span, decl.name, tuple(args), t)
        arity = 2 if decl.kind == "cross_attention" else 1
        args = self._args(e, arity)
        if args is None:
            return None
        t = self.scope.values[args[0]]
        if decl.category == "norm":
            return self.build("norm(x)", name, e.span, decl.name, args[0])
        if decl.kind == "embedding":
            width = self.scope.dims.get(decl.arg("width"))
            if width is not None:
                t = TensorType(t.axes + (width,), t.dtype)
        if decl.kind in ("linear", "head"):
            out = self.scope.dims.get(decl.arg("out_dim" if decl.kind == "linear" else "vocab"))
            if out is not None and t.axes:
                t = t.with_last(out)
        return self.build("decl(x)", name, e.span, decl.name, tuple(args), t)

    def _call_function(self, e: ast.Call, name: str | None) -> str | None:
        fn = e.callee
        if fn in ACTIVATIONS or fn in GATES:
            args = self._args(e, 1)
            if args is None:
                return None
            return self.build("fn(x)", name, e.span, fn, args[0])
        if fn in ("dropout", "drop_path", "layer_drop"):
            return self._dropout(e, name)
        if fn == "cast":
            return self._cast(e, name)
        if fn == "zeros":
            return self._zeros(e, name)
        # concat
        if len(e.args) < 2:
            self.err("E0106", "'concat' takes at least 2 tensor arguments", e.span)
            return None
        args = self._args(e, None)
        if args is None:
            return None
        return self.build("concat(…)", name, e.span, tuple(args))

    def _call_kind_function(self, e: ast.Call, name: str | None) -> str | None:
        """``NAME(x, key=c, …)`` of a function an op kind registers: one tensor, each keyword a constant."""
        construct, keywords = kind_functions()[e.callee]
        args = self._args(e, 1, keywords)
        values: dict[str, C.ConstExpr] = {}
        for key in keywords:
            kw = self._kw(e, key)
            if kw is None:
                self.err("E0105", f"'{e.callee}' needs {key}=…", e.span,
                         f"write {e.callee}(x, {', '.join(k + '=…' for k in keywords)})")
                return None
            value = to_const(kw.value, self.scope)
            if value is None:
                return None
            values[key] = value
        if args is None:
            return None
        return self.build(construct, name, e.span, args[0], **values)

    def _zeros(self, e: ast.Call, name: str | None) -> str | None:
        lit = e.args[0] if len(e.args) == 1 and not e.kwargs else None
        if not isinstance(lit, ast.AxesLit):
            self.err("E0106", "'zeros' takes one axis list: zeros([B, H, S, S])", e.span)
            return None
        axes = []
        for n in lit.names:
            if n not in self.scope.dims:
                self.scope.undefined(n, lit.span, "dim")
                return None
            axes.append(self.scope.dims[n])
        return self.build("zeros([…])", name, e.span, tuple(axes), lit.span)

    def _kw(self, e: ast.Call, key: str) -> ast.KwArg | None:
        return next((k for k in e.kwargs if k.name == key), None)

    def _dropout(self, e: ast.Call, name: str | None) -> str | None:
        allowed = ("p", "mask") if e.callee == "dropout" else ("p",)
        args = self._args(e, 1, allowed)
        p_kw = self._kw(e, "p")
        if p_kw is None:
            self.err("E0105", f"'{e.callee}' needs the drop probability p=…", e.span,
                     f"write {e.callee}(x, p=0.1); p=0 states that the branch has none")
            return None
        p = to_const(p_kw.value, self.scope)
        mask = "sample" if e.callee == "drop_path" else "element"
        mask_kw = self._kw(e, "mask")
        if mask_kw is not None:
            word = mask_kw.value.name if isinstance(mask_kw.value, ast.Ref) else None
            if word not in MASKS:
                self.err("E0107", "mask must be one of " + ", ".join(MASKS), mask_kw.value.span,
                         suggest(word or "", MASKS))
                return None
            mask = word
        value = self.env(p) if p is not None else None
        if value is not None and not 0.0 <= value < 1.0:
            self.err("E0109", f"drop probability must lie in [0, 1), got {value}", p_kw.value.span,
                     "p is the probability of dropping; 1 would drop everything")
            return None
        if args is None or p is None:
            return None
        return self.build(f"{e.callee}(x)", name, e.span, args[0], p, mask)

    def _cast(self, e: ast.Call, name: str | None) -> str | None:
        if len(e.args) != 2 or e.kwargs:
            self.err("E0106", "'cast' takes a tensor and a dtype: cast(x, f32)", e.span)
            return None
        target = e.args[1]
        word = target.name if isinstance(target, ast.Ref) else None
        if word not in {d.value for d in DType}:
            self.err("E0107", "expected a dtype (f64, f32, f16, bf16)", target.span, suggest(word or "", [d.value for d in DType]))
            return None
        operand = self.tensor(e.args[0])
        if operand is None:
            return None
        return self.build("cast(x, t)", name, e.span, operand, DType(word))


def role_of(word: str) -> Role | None:
    try:
        return Role(word)
    except ValueError:
        return None
