"""Attention branches as the built-in ``self_attention`` or ``cross_attention``: read from the branch's structure,
confirmed by running it.

An attention's causality, rotary embedding and head split are not visible in its parameters, and
its forward (masks, rotary tables, head reshapes) does not trace symbolically. So the recogniser
works the other way round. The branch's *structure* proposes the declaration: it must own exactly
four projection matrices (three read the branch's input, as the recorded calls show, and one
produces its result; a branch over a state and a memory is a cross-attention: one reads the state, two
the memory), optionally their biases and a per-head scale, and declare its ``head_dim``;
the projections' widths then give ``heads`` and ``kv_heads``. Each row of :data:`VARIANTS` is one
candidate setting of what the parameters do not tell; the first whose built-in, loaded strictly
with the branch's own ``state_dict`` and called as the compiled lift calls it, reproduces the
branch on the example inputs (forward, in evaluation mode) is the declaration. A branch that is
stochastic in training (attention dropout inside) is no built-in without dropout: it stays an extern.
Nothing here reads a class name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from blockir.lift.certificate import evaluating, invoke
from blockir.lift.trace import Call, python_path

# what the parameters leave open, tried in this order, one variant a line; the first that reproduces the
# branch bit for bit wins, else the first within TOLERANCE (an eager attention is exact only against eager)
VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("causal", {"causal": True, "rope": False, "impl": "sdpa"}),
    ("causal, rotary", {"causal": True, "rope": True, "impl": "sdpa"}),
    ("bidirectional", {"causal": False, "rope": False, "impl": "sdpa"}),
    ("bidirectional, rotary", {"causal": False, "rope": True, "impl": "sdpa"}),
    ("causal, eager", {"causal": True, "rope": False, "impl": "eager"}),
    ("causal, rotary, eager", {"causal": True, "rope": True, "impl": "eager"}),
    ("bidirectional, eager", {"causal": False, "rope": False, "impl": "eager"}),
    ("bidirectional, rotary, eager", {"causal": False, "rope": True, "impl": "eager"}),
)
TOLERANCE = 1e-6  # relative, on the forward: the certificate then checks every gradient of the whole lift
# a branch with a learned q/k scale or modules of its own besides the projections (parameter-free q/k norms) is
# tried with its q and k L2-normalized as well, its scores scaled as usual or by sqrt(head_dim) (nGPT)
NORMED: tuple[tuple[str, dict[str, Any]], ...] = tuple(
    (f"{name}, L2 q/k{note}", {**variant, "qk_norm": "l2norm", "root_scale": root})
    for name, variant in VARIANTS for note, root in (("", False), (", scores times sqrt(head_dim)", True)))
# the cross-attention's variants: only the kernel is left open (it has no causal mask and no rotation)
CROSS_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("sdpa", {"impl": "sdpa"}),
    ("eager", {"impl": "eager"}),
)
_ROLES = ("q", "k", "v")
_DEFAULT = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}


@dataclass(frozen=True)
class Shape:
    """What the structure fixes: the head split, the layers' names, biases and the per-head scale."""

    heads: int
    kv_heads: int
    head_dim: int
    names: dict[str, str]
    bias: bool
    out_bias: bool
    head_scale: bool
    qk_scale: bool  # a learned scale of q and k, one per query channel
    normed: bool  # the q/k normalizations are worth trying (a q/k scale, or parameter-free modules of its own)


def _reading(calls: dict[str, Call], prefix: str, layers: dict[str, nn.Module], x: Tensor) -> list[str]:
    """The layers whose recorded calls read ``x``, in call order."""
    return [n[len(prefix):] for n in calls if n.startswith(prefix) and n[len(prefix):] in layers and
            any(v is x for v in calls[n].arguments.values())]


def _projections(module: nn.Module, calls: dict[str, Call], prefix: str, x: Tensor,
                 memory: Tensor | None) -> Shape | None:
    children = dict(module.named_children())
    own = {k: p for k, p in module.named_parameters(recurse=False)}
    layers = {n: m for n, m in children.items() if any(True for _ in m.parameters())}
    if len(layers) != 4 or set(own) - {"head_scale", "qk_scale"} or \
            any(len(list(m.children())) for m in layers.values()):
        return None
    for m in layers.values():
        keys = dict(m.named_parameters())
        w = keys.get("weight")
        if w is None or w.ndim != 2 or set(keys) - {"weight", "bias"}:
            return None
    # the recorded calls in call order: the three that read the branch's input are q, k and v; with a memory,
    # q reads the state and k, v the memory
    reads = _reading(calls, prefix, layers, x)
    if memory is not None:
        reads = reads + _reading(calls, prefix, layers, memory) if len(reads) == 1 else []
    rest = [n for n in layers if n not in reads]
    head_dim = getattr(module, "head_dim", None)
    if len(reads) != 3 or len(rest) != 1 or not isinstance(head_dim, int) or head_dim <= 0:
        return None
    names = dict(zip(_ROLES, reads)) | {"o": rest[0]}
    w = {r: layers[n].get_parameter("weight") for r, n in names.items()}
    width = int(x.shape[-1])
    q_out, kv_out = int(w["q"].shape[0]), int(w["k"].shape[0])
    if any(int(w[r].shape[1]) != width for r in _ROLES) or tuple(w["o"].shape) != (width, q_out) or \
            tuple(w["v"].shape) != tuple(w["k"].shape) or q_out % head_dim or kv_out % head_dim:
        return None
    heads, kv_heads = q_out // head_dim, kv_out // head_dim
    if not kv_heads or heads % kv_heads or "head_scale" in own and tuple(own["head_scale"].shape) != (heads,) or \
            "qk_scale" in own and tuple(own["qk_scale"].shape) != (q_out,):
        return None
    biased = [getattr(layers[names[r]], "bias", None) is not None for r in _ROLES]
    if len(set(biased)) != 1:
        return None
    return Shape(heads, kv_heads, head_dim, names, biased[0], getattr(layers[names["o"]], "bias", None) is not None,
                 "head_scale" in own, "qk_scale" in own, "qk_scale" in own or len(children) > len(layers))


def _text(shape: Shape, variant: dict[str, Any], theta: float | None, width: int) -> str:
    kind = "self_attention" if "causal" in variant else "cross_attention"
    args = [f"heads={shape.heads}"]
    args += [f"kv_heads={shape.kv_heads}"] if shape.kv_heads != shape.heads else []
    args += [f"head_dim={shape.head_dim}"] if shape.head_dim * shape.heads != width else []
    args += [f"causal={'true' if variant['causal'] else 'false'}"] if "causal" in variant else []
    args += ["rope=true"] if variant.get("rope") else []
    args += [f"rope_theta={theta:g}"] if variant.get("rope") and theta not in (None, 10000.0) else []
    args += ["bias=true"] if shape.bias else []
    args += ["out_bias=true"] if shape.out_bias else []
    args += ["head_scale=true"] if shape.head_scale else []
    args += [f"qk_norm={variant['qk_norm']}"] if variant.get("qk_norm") else []
    args += ["qk_scale=true"] if shape.qk_scale else []
    args += [f"scale={shape.head_dim ** 0.5!r}"] if variant.get("root_scale") else []
    args += [f"impl={variant['impl']}"] if variant["impl"] != "sdpa" else []
    args += [f"{role}={name}" for role, name in shape.names.items() if name != _DEFAULT[role]]
    return f"{kind}({', '.join(args)})"


def _builtin(text: str, width: int, batch: int, seq: int, memory: int | None) -> nn.Module:
    from blockir.api import parse
    from blockir.lower.compile import compile

    params, args = ("x: [B, S, D]", "x") if memory is None else ("x: [B, S, D], m: [B, T, D]", "x, m")
    source = (f"dim B: batch\ndim S: seq\ndim T: seq\ndim D: model = {width}\n"
              f"block A({params}) -> [B, S, D] {{\n  attn: {text}\n  y = attn({args})\n  return y\n}}\n")
    dims = {"B": batch, "S": seq, "T": memory or seq}
    return compile(parse(source, "<lift attention>"), "A", dims=dims).get_submodule("attn")


def _first(out: Any) -> Any:
    while isinstance(out, (tuple, list)) and out:
        out = out[0]
    return out


def _stochastic(module: nn.Module, call: Call) -> bool:
    """Does the branch draw random numbers in training (attention-probability dropout)?"""
    outs = []
    with torch.random.fork_rng(), torch.no_grad(), python_path():
        for seed in (1, 2):
            torch.manual_seed(seed)
            outs.append(_first(invoke(module, call, {})))
    return not torch.equal(outs[0], outs[1])


def builtin_attention(module: nn.Module, call: Call, calls: dict[str, Call], prefix: str,
                      context: dict[str, Any]) -> str | None:
    """The ``self_attention(...)`` (or, over a state and a memory, ``cross_attention(...)``) declaration that
    computes what ``module`` does as called, or None.

    ``prefix`` is the branch's path in the recorded ``calls`` (ending in a dot); ``context`` the
    keyword values the compiled lift passes its branches (the lifted root's side inputs).
    """
    streams = [v for v in call.arguments.values() if isinstance(v, Tensor) and v.is_floating_point() and v.dim() == 3]
    if len(streams) not in (1, 2):
        return None
    x, memory = streams[0], streams[1] if len(streams) == 2 else None
    shape = _projections(module, calls, prefix, x, memory)
    if shape is None or _stochastic(module, call):
        return None
    state = module.state_dict()
    theta = getattr(module, "rope_theta", None)
    theta = float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) else None
    with torch.no_grad(), evaluating(module), python_path():
        want = _first(invoke(module, call, {}))
        if not isinstance(want, Tensor) or want.shape != x.shape:
            return None
        scale = want.abs().max().item() or 1.0
        close = None
        variants = CROSS_VARIANTS if memory is not None else VARIANTS + NORMED if shape.normed else VARIANTS
        for _, variant in variants:
            text = _text(shape, variant, theta, int(x.shape[-1]))
            candidate = _builtin(text, int(x.shape[-1]), int(x.shape[0]), int(x.shape[1]),
                                 None if memory is None else int(memory.shape[1])).eval()
            if set(candidate.state_dict()) != set(state):
                return None
            candidate.load_state_dict(state, strict=True)
            reads = getattr(candidate, "blockir_context", frozenset())
            try:
                got = candidate(*([x] if memory is None else [x, memory]),
                                **{k: v for k, v in context.items() if k in reads})
            except Exception:  # the caller's tables or masks do not fit this variant (a partial rotary)
                continue
            if got.shape != want.shape:
                continue
            if torch.equal(got, want):
                return text
            if close is None and (got - want).abs().max().item() <= TOLERANCE * scale:
                close = text
    return close
