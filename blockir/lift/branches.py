"""Branch submodules as built-in declarations: a module whose whole trace is a linear, an MLP or a
gated MLP over its one input becomes ``linear`` / ``mlp`` / ``gated_mlp`` under its own path.

Every other branch stays an ``extern`` bound to the original module. The rules read the traced
operations and the parameter keys, never the class.
"""
from __future__ import annotations

from typing import Any, Callable

import torch.fx as fx
from torch import nn

from blockir.lift.match import arguments, compile_pattern, match
from blockir.lift.trace import Call, TraceFailure, symbolic

# the activations a built-in branch may apply, as patterns over their input A
_ACTS = {"relu": "relu(A)", "silu": "silu(A)", "tanh": "tanh(A)", "gelu": "gelu(A, _)"}


def _act_patterns(template: str) -> list[tuple[Any, str]]:
    return [(compile_pattern(template.format(act="ACT:" + act.replace("A", "linear(X, WG@param, BG)"))), name)
            for name, act in _ACTS.items()]


# the output node of the branch's trace against each shape; {act} is the activation of the first linear
GATED = _act_patterns("linear(mul({act}, linear(X, WU@param, BU)), WD@param, BD)")
PLAIN = _act_patterns("linear({act}, WD@param, BD)")
LINEAR = compile_pattern("linear(X, W@param, BIAS)")


def _act(node: fx.Node, name: str) -> str:
    """The activation's name in the language: a GELU says which form it computes."""
    return "gelu_tanh" if name == "gelu" and arguments(node)[1] == "tanh" else name


def _key(n: Any) -> str | None:
    return None if n is None else str(n.target).removeprefix("inner.")


def builtin_branch(module: nn.Module, call: Call, dim: Callable[[int], str]) -> str | None:
    """The declaration text (after ``NAME: ``) of a built-in equal to ``module``, or None."""
    try:
        gm, _ = symbolic(module, call, set())
    except TraceFailure:
        return None
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # one input read; side inputs the forward accepts (a compiled branch takes **ctx) are fine unread
    if not isinstance(out, fx.Node) or not placeholders or any(n.users for n in placeholders[1:]):
        return None
    keys = set(module.state_dict())
    c = match(LINEAR, out, {})
    if c is not None and c["X"].op == "placeholder":
        w = module.get_parameter(_key(c["W"]) or "")
        has_bias = c["BIAS"] is not None
        if keys == {"weight", *(["bias"] if has_bias else [])} and _key(c["BIAS"]) in (None, "bias"):
            return f"linear({dim(w.shape[1])}, {dim(w.shape[0])}, bias={'true' if has_bias else 'false'})"
    for pat, act in GATED:
        c = match(pat, out, {})
        if c is None or c["X"].op != "placeholder" or any(c[b] is not None for b in ("BG", "BU", "BD")):
            continue
        names = {"gate": _key(c["WG"]), "up": _key(c["WU"]), "down": _key(c["WD"])}
        if keys != set(names.values()) or not all(n and n.endswith(".weight") for n in names.values()):
            continue
        hidden = dim(module.get_parameter(names["gate"] or "").shape[0])
        fn = _act(c["ACT"], act)
        own = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
        extra = "".join(f", {k}={v.removesuffix('.weight')}" for k, v in names.items()
                        if v and v.removesuffix(".weight") != own[k])
        return f"gated_mlp({hidden}, act={fn}, bias=false{extra})"
    for pat, act in PLAIN:
        c = match(pat, out, {})
        if c is None or c["X"].op != "placeholder" or (c["BG"] is None) != (c["BD"] is None):
            continue
        bias = c["BG"] is not None
        names = {"fc1": _key(c["WG"]), "fc2": _key(c["WD"])}
        want = {k for n in names.values() if n for k in (n, *([n.removesuffix(".weight") + ".bias"] if bias else []))}
        if keys != want or not all(n and n.endswith(".weight") for n in names.values()):
            continue
        hidden = dim(module.get_parameter(names["fc1"] or "").shape[0])
        fn = _act(c["ACT"], act)
        extra = "".join(f", {k}={v.removesuffix('.weight')}" for k, v in names.items()
                        if v and v.removesuffix(".weight") != k)
        return f"mlp({hidden}, act={fn}, bias={'true' if bias else 'false'}{extra})"
    return None
