"""A small pattern language over torch.fx nodes, in which the lift's rule table is written.

A pattern is an expression: ``op(ARG, …)`` matches a call whose operation has that canonical
name (``mul`` is ``operator.mul``, ``torch.mul`` and ``Tensor.mul`` alike; ``cast`` is ``.to``,
``.float``, ``.type_as``), arguments in the order :data:`SIGNATURES` gives (keywords folded in);
``add`` and ``mul`` match either operand order. ``op?(P)`` is optional: it matches ``op(P)`` or
``P`` itself. ``NAME`` captures a node or constant (a second use must be the same one),
``NAME@param`` only a parameter read (``get_attr``) and ``NAME@const`` only a Python number;
``NAME:pattern`` captures what the pattern matched; ``_`` matches anything; a number matches
an equal constant.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from blockir.lower import fx as fx_backend
from blockir.lower.layers.norm_module import family_forward
from blockir.norms import FAMILIES
from blockir.norms.layernorm import layer_norm
from blockir.norms.rmsnorm import rms_norm

CANONICAL: dict[Any, str] = {
    # what a module compiled by blockir calls: each norm family's one function, or its forward on the module
    **{f.math: "blockir_norm" for f in FAMILIES.values() if f.math is not None}, family_forward: "blockir_family_norm",
    operator.add: "add", operator.iadd: "add", torch.add: "add", "add": "add", "add_": "add",
    operator.mul: "mul", operator.imul: "mul", torch.mul: "mul", "mul": "mul", "mul_": "mul",
    operator.truediv: "div", torch.div: "div", "div": "div", "div_": "div",
    operator.sub: "sub", torch.sub: "sub", "sub": "sub", torch.rsub: "rsub",
    operator.pow: "pow", torch.pow: "pow", "pow": "pow",
    torch.mean: "mean", "mean": "mean", torch.var: "var", "var": "var",
    torch.rsqrt: "rsqrt", "rsqrt": "rsqrt", torch.sqrt: "sqrt", "sqrt": "sqrt",
    torch.square: "square", "square": "square",
    "to": "cast", "float": "cast", "type_as": "cast", "type": "cast", "half": "cast", "bfloat16": "cast",
    "contiguous": "same", "clone": "same", "view": "reshape", "reshape": "reshape", torch.reshape: "reshape",
    "view_as": "reshape", "reshape_as": "reshape",
    F.normalize: "normalize", F.layer_norm: "layer_norm", F.rms_norm: "rms_norm", F.dropout: "dropout", F.linear: "linear",
    F.relu: "relu", torch.relu: "relu", "relu": "relu", F.gelu: "gelu", F.silu: "silu",
    torch.tanh: "tanh", "tanh": "tanh", F.tanh: "tanh", torch.sigmoid: "sigmoid", "sigmoid": "sigmoid",
    F.sigmoid: "sigmoid", torch.erf: "erf", "erf": "erf",
    operator.getitem: "getitem", torch.cat: "cat", torch.concat: "cat", torch.concatenate: "cat",
    # the norms whose call states their settings, and the keyed dropout
    rms_norm: "blockir_rms_norm", layer_norm: "blockir_layer_norm",
    fx_backend.dropout_site: "blockir_dropout",
}
SIGNATURES: dict[str, tuple[str, ...]] = {
    "mean": ("input", "dim", "keepdim"), "var": ("input", "dim", "unbiased", "keepdim"),
    "pow": ("input", "exponent"), "cast": ("input", "dtype"),
    "layer_norm": ("input", "normalized_shape", "weight", "bias", "eps"),
    "rms_norm": ("input", "normalized_shape", "weight", "eps"), "normalize": ("input", "p", "dim", "eps"),
    "dropout": ("input", "p", "training", "inplace"), "linear": ("input", "weight", "bias"),
    "gelu": ("input", "approximate"), "add": ("input", "other", "alpha"), "sub": ("input", "other", "alpha"),
    "mul": ("input", "other"), "cat": ("tensors", "dim"), "div": ("input", "other"), "rsub": ("input", "other"),
    "blockir_rms_norm": ("x", "weight", "eps", "offset", "cast", "accum", "features"),
    "blockir_layer_norm": ("x", "weight", "bias", "eps", "accum", "offset", "two_pass", "recenter", "upcast"),
    "blockir_dropout": ("x", "p", "mask", "training", "seed", "layer", "site"),
    "blockir_family_norm": ("x", "attention_mask", "module"),
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "layer_norm": {"weight": None, "bias": None, "eps": 1e-5}, "normalize": {"p": 2.0, "dim": 1, "eps": 1e-12}, "rms_norm": {"weight": None, "eps": None},
    "dropout": {"p": 0.5, "training": True, "inplace": False}, "linear": {"bias": None},
    "mean": {"dim": None, "keepdim": False}, "gelu": {"approximate": "none"},
    "var": {"dim": None, "unbiased": True, "keepdim": False}, "cat": {"dim": 0},
    "blockir_rms_norm": {"offset": 0, "cast": "before_weight", "accum": torch.float32, "features": None},
    "blockir_layer_norm": {"accum": torch.float32, "offset": 0, "two_pass": False, "recenter": False, "upcast": False},
}
COMMUTATIVE = frozenset({"add", "mul"})


def canonical(node: Any) -> str | None:
    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method"):
        return None
    try:
        return CANONICAL.get(node.target)
    except TypeError:  # an unhashable target
        return None


def arguments(node: fx.Node) -> list[Any]:
    """The node's arguments in the canonical order of its operation, keywords and defaults folded in."""
    name = canonical(node)
    sig = SIGNATURES.get(name or "")
    args = list(node.args)
    if sig is None:
        return args
    defaults = DEFAULTS.get(name or "", {})
    out = args + [node.kwargs.get(k, defaults.get(k)) for k in sig[len(args):]]
    if name == "var" and "correction" in node.kwargs:
        out[2] = node.kwargs["correction"] != 0
    return out


@dataclass(frozen=True)
class Pat:
    kind: str  # op | cap | lit | any
    name: str = ""
    args: tuple["Pat", ...] = ()
    optional: bool = False
    constraint: str = ""
    label: str = ""
    value: float = 0.0


_TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\d+)|([A-Za-z_][A-Za-z0-9_]*)|(.))")


def compile_pattern(text: str) -> Pat:
    tokens = [m for m in _TOKEN.findall(text) if any(m)]
    pos = 0

    def peek() -> str:
        return "".join(tokens[pos]) if pos < len(tokens) else ""

    def take() -> tuple[str, str, str]:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def expr() -> Pat:
        num, name, sym = take()
        if num:
            return Pat("lit", value=float(num))
        if name == "_":
            return Pat("any")
        label = ""
        if peek() == ":":
            take()
            label, (num, name, sym) = name, take()
        if name[0].isupper():
            constraint = ""
            if peek() == "@":
                take()
                constraint = take()[1]
            return Pat("cap", name=name, constraint=constraint)
        optional = False
        if peek() == "?":
            take()
            optional = True
        assert take()[2] == "(", text
        args: list[Pat] = []
        while peek() != ")":
            args.append(expr())
            if peek() == ",":
                take()
        take()
        return Pat("op", name=name, args=tuple(args), optional=optional, label=label)

    out = expr()
    assert pos == len(tokens), text
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bind(caps: dict[str, Any], name: str, obj: Any) -> dict[str, Any] | None:
    if name in caps:
        return caps if caps[name] is obj or (_is_number(obj) and caps[name] == obj) else None
    return {**caps, name: obj}


def match(p: Pat, obj: Any, caps: dict[str, Any]) -> dict[str, Any] | None:
    """The captures extended by matching ``p`` against ``obj``, or None."""
    if p.kind == "any":
        return caps
    if p.kind == "lit":
        return caps if _is_number(obj) and float(obj) == p.value else None
    if p.kind == "cap":
        if p.constraint == "param" and not (isinstance(obj, fx.Node) and obj.op == "get_attr"):
            return None
        if p.constraint == "const" and not _is_number(obj):
            return None
        return _bind(caps, p.name, obj)
    if canonical(obj) == p.name:
        args = arguments(obj)
        orders = [args]
        if p.name in COMMUTATIVE and len(args) >= 2:
            orders.append([args[1], args[0], *args[2:]])
        for order in orders:
            got: dict[str, Any] | None = caps
            for sub, a in zip(p.args, order):
                got = match(sub, a, got) if got is not None else None
            if got is not None and len(order) >= len(p.args):
                return _bind(got, p.label, obj) if p.label else got
    if p.optional and len(p.args) == 1:
        return match(p.args[0], obj, caps)
    return None
