"""The rule table: traced-graph patterns and the ``.block`` operation each one becomes.

One rule a line, tried in order at every node the lift reaches from the block's result; the first
whose pattern matches (see :mod:`blockir.lift.match`) and whose builder accepts the captures
decides the node. Norm rules come first because their root is a ``mul`` or a ``cast`` that the
generic rules would otherwise take apart. A node no rule decides is E0901.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.fx as fx

from blockir.lower.fx import site_id
from blockir.lift.match import Pat, arguments, canonical, compile_pattern
from blockir.norms.base import number as _num

if TYPE_CHECKING:
    from blockir.lift.lifter import Lifter


@dataclass(frozen=True)
class Out:
    """A recognised operation: ``expr`` with ``{0}``, ``{1}``… standing for the lifted ``inputs``."""

    expr: str
    inputs: tuple[fx.Node, ...]
    axes: tuple[str, ...] | None = None  # the result's axes when not those of the first input
    key: fx.Node | None = None  # the node that locates the operation, when not the rule's root
    name: str | None = None  # the value's name when the traced code states it (a compiled dropout site's key)


Builder = Callable[["Lifter", fx.Node, dict[str, Any]], Out | None]


def _num32(v: float) -> str:
    """The shortest decimal that rounds to the same float32: a gain stored in f32 prints as written."""
    v = float(v)
    for digits in range(1, 10):
        text = f"{v:.{digits}g}"
        if torch.tensor(float(text), dtype=torch.float32).item() == torch.tensor(v, dtype=torch.float32).item():
            return _num(float(text))
    return _num(v)


def _eps(v: Any) -> str:
    return _num(v)


def _dim_index(lift: "Lifter", x: fx.Node, dim: Any) -> int | None:
    rank = lift.rank(x)
    if isinstance(dim, (list, tuple)):
        if len(dim) != 1:
            return None
        dim = dim[0]
    if not isinstance(dim, int) or rank is None:
        return None
    return dim % rank


def _norm_axis(lift: "Lifter", x: fx.Node, dim: Any, key: fx.Node) -> str:
    i = _dim_index(lift, x, dim)
    if i is None:
        lift.fail("E0903", key, f"the norm at '{key.name}' reduces over {dim!r}, not one axis of its input",
                  "reduce over the feature axis of each row, as a LayerNorm(D) or RMSNorm(D) does")
    return lift.axes(x)[i]


def _gain(lift: "Lifter", w: Any) -> tuple[str, str]:
    """(declaration name, argument text naming the parameter when it is not ``weight``)."""
    path = lift.param_path(w)
    owner, _, leaf = path.rpartition(".")
    if not owner:
        lift.fail("E0904", w, f"the norm gain '{path}' is a parameter of the lifted module itself",
                  "hold the gain in a submodule of its own (as nn.LayerNorm and RMSNorm classes do)")
    return owner, "" if leaf == "weight" else f", weight_name={leaf}"


def _owner(lift: "Lifter", node: fx.Node) -> str:
    return lift.owner(node)


def layer_norm(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    shape = c["SHAPE"]
    if not isinstance(shape, (list, tuple)) or len(shape) != 1:
        lift.fail("E0903", node, f"layer_norm over {shape!r}: the lift reads a norm over one axis only",
                  "normalize over the feature axis: nn.LayerNorm(D)")
    rank = lift.rank(c["X"])
    axis = lift.axes(c["X"])[-1] if rank else "D"
    w, b = c["W"], c["BIAS"]
    if w is None:
        name, extra = _owner(lift, node), ", affine=false"
    else:
        name, extra = _gain(lift, w)
        if b is None:
            extra += ", bias=false"
        elif lift.param_path(b).rpartition(".")[0] != name:
            return None
        elif not lift.param_path(b).endswith(".bias"):
            extra += f", bias_name={lift.param_path(b).rpartition('.')[2]}"
    text = f"layernorm({axis}, eps={_eps(c['EPS'])}{extra})"
    return Out(f"{lift.declare(name, text, node)}({{0}})", (c["X"],))


def rms_norm(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    shape = c["SHAPE"]
    if not isinstance(shape, (list, tuple)) or len(shape) != 1:
        lift.fail("E0903", node, f"rms_norm over {shape!r}: the lift reads a norm over one axis only",
                  "normalize over the feature axis: nn.RMSNorm(D)")
    if c["W"] is None:
        lift.fail("E0902", node, "an RMSNorm without a gain has no declaration to lift to",
                  "give the norm a learned weight (elementwise_affine=True)")
    eps = c["EPS"] if c["EPS"] is not None else torch.finfo(lift.dtype(c["X"])).eps
    name, extra = _gain(lift, c["W"])
    axis = lift.axes(c["X"])[-1]
    text = f"rmsnorm({axis}, eps={_eps(eps)}{extra})"
    return Out(f"{lift.declare(name, text, node)}({{0}})", (c["X"],))


def rmsnorm(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    """A hand-written RMSNorm; where the cast back sits decides ``cast``, ``1 + w`` decides ``offset``."""
    if c["R"].args[0] is None or c.get("KEEP") is False:
        return None
    mean_args = arguments(c["R"])
    if not mean_args[2]:
        return None
    axis = _norm_axis(lift, c["X"], mean_args[1], c["R"])
    name, extra = _gain(lift, c["W"])
    if lift.rank(c["W"]) != 1:
        return None
    cast = "after_weight" if "O" in c and "I" not in c else "before_weight"
    offset = ", offset=1" if c.get("ONE") else ""
    if c.get("ONE"):
        lift.check_offset(c["W"], node)
    text = f"rmsnorm({axis}, eps={_eps(c['EPS'])}{offset}, cast={cast}{extra})"
    return Out(f"{lift.declare(name, text, c['R'])}({{0}})", (c["X"],), key=c["R"])


def rmsnorm_offset(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    return rmsnorm(lift, node, {**c, "ONE": True})


def layernorm_hand(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    """A hand-written LayerNorm: ``(x - mean) * rsqrt(var + eps) * w + b``."""
    m_args, r_args = arguments(c["M"]), arguments(c["R"])
    if not (m_args[2] and r_args[-1]) or canonical(c["R"]) == "var" and r_args[2]:
        return None
    axis = _norm_axis(lift, c["X"], m_args[1], c["M"])
    if _norm_axis(lift, c["X"], r_args[1], c["R"]) != axis:
        return None
    name, extra = _gain(lift, c["W"])
    if lift.param_path(c["BIAS"]) != f"{name}.bias":
        return None
    text = f"layernorm({axis}, eps={_eps(c['EPS'])}, two_pass=true{extra})"
    return Out(f"{lift.declare(name, text, c['M'])}({{0}})", (c["X"],), key=c["M"])


_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}


def compiled_rms_norm(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    """The RMSNorm of a module blockir compiled: its settings are the call's arguments; a pRMSNorm's share is the
    features its RMS reads over the width (ceil of that share times the width is those features again)."""
    name, extra = _gain(lift, c["W"])
    if c["FEATURES"] is not None:
        extra += f", partial={_num(c['FEATURES'] / int(lift.shape(c['X'])[-1]))}"
    text = (f"rmsnorm({lift.axes(c['X'])[-1]}, eps={_num(c['EPS'])}, offset={c['OFFSET']}, cast={c['CAST']}, "
            f"accum={_DTYPES.get(c['ACCUM'], 'f32')}{extra})")
    return Out(f"{lift.declare(name, text, node)}({{0}})", (c["X"],))


def compiled_layer_norm(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    if c["W"] is None:
        name, extra = _owner(lift, node), ", affine=false"
    else:
        name, extra = _gain(lift, c["W"])
        extra += ", bias=false" if c["BIAS"] is None else ""
    flags = "".join(f", {k}=true" for k in ("two_pass", "recenter", "upcast") if c[k.upper()])
    text = (f"layernorm({lift.axes(c['X'])[-1]}, eps={_num(c['EPS'])}, offset={c['OFFSET']}, "
            f"accum={_DTYPES.get(c['ACCUM'], 'f32')}{flags}{extra})")
    return Out(f"{lift.declare(name, text, node)}({{0}})", (c["X"],))


def _site_name(lift: "Lifter", site: Any) -> str | None:
    """The value name a compiled module keys this dropout's mask by: masks are drawn per (seed, layer, value
    name), so the lift keeps the name and with it the masks."""
    names = getattr(lift.traced.module, "blockir_values", None) or {}
    return next((ssa for ssa in names if isinstance(site, int) and site_id(ssa) == site), None)


def compiled_dropout(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    name = _site_name(lift, c["SITE"])
    if c["MASK"] == "sample":
        return Out(f"drop_path({{0}}, p={_num(c['P'])})", (c["X"],), name=name)
    mask = "" if c["MASK"] == "element" else f", mask={c['MASK']}"
    return Out(f"dropout({{0}}, p={_num(c['P'])}{mask})", (c["X"],), name=name)


def _declared(lift: "Lifter", node: fx.Node, x: fx.Node, path: str) -> Out | None:
    """A norm module blockir compiled, as the declaration its family reads back from the module's settings."""
    module = lift.submodule(path)
    fam = getattr(module, "family", None)
    args = fam.declared(module) if fam is not None else None
    if args is None:
        return None
    text = f"{fam.name}({lift.axes(x)[-1]}, {args})"
    return Out(f"{lift.declare(path, text, node)}({{0}})", (x,))


def compiled_norm(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    return _declared(lift, node, c["X"], _owner(lift, node))


def compiled_family_norm(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    return _declared(lift, node, c["X"], lift.param_path(c["M"]))


def dyt(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    """A hand-written Dynamic Tanh, ``w * tanh(alpha * x) + b``: the alpha it holds now is its ``alpha=``."""
    name, extra = _gain(lift, c["W"])
    alpha, bias = lift.param(c["A"]), lift.param_path(c["BIAS"])
    if lift.param_path(c["A"]) != f"{name}.alpha" or alpha.numel() != 1 or bias.rpartition(".")[0] != name:
        return None
    extra += "" if bias.endswith(".bias") else f", bias_name={bias.rpartition('.')[2]}"
    text = f"dyt({lift.axes(c['X'])[-1]}, alpha={_num32(float(alpha.detach().reshape(())))}{extra})"
    return Out(f"{lift.declare(name, text, node)}({{0}})", (c["X"],))


def l2_normalize(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    """``F.normalize(x, dim=-1)``: an ``l2norm``, named inside the module that calls it (it learns nothing)."""
    if float(c["P"]) != 2:
        return None
    axis = _norm_axis(lift, c["X"], c["DIM"], node)
    text = f"l2norm({axis}, eps={_num(c['EPS'])})"
    return Out(f"{lift.declare(_owner(lift, node) + '.l2norm', text, node)}({{0}})", (c["X"],))


def dropout(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    if not isinstance(c["P"], (int, float)):
        return None
    return Out(f"dropout({{0}}, p={_num(c['P'])})", (c["X"],))


def drop_path(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    """``x * mask`` or ``x / keep * mask`` with a per-sample Bernoulli mask (timm's drop_path)."""
    x, mask = c["X"], c["M"]
    keep = lift.bernoulli_keep(mask)
    if keep is None or lift.shape(mask) is None or any(s != 1 for s in lift.shape(mask)[1:]):
        return None
    return Out(f"drop_path({{0}}, p={_num32(1 - keep)})", (x,))


def scale(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    return Out(f"{lift.constant(c['C'])} * {{0}}", (c["X"],)) if lift.is_tensor(c["X"]) else None


def scale_div(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    return Out(f"{_num(1 / c['C'])} * {{0}}", (c["X"],)) if lift.is_tensor(c["X"]) and c["C"] else None


def learned_gain(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    if not lift.is_tensor(c["X"]) or c["X"].op == "get_attr":
        return None
    path = lift.param_path(c["G"])
    p = lift.param(c["G"])
    offset = ", offset=1" if c.get("ONE") else ""
    if p.numel() == 1 and p.ndim <= 1:
        init = float(p.detach().reshape(())) + (1 if c.get("ONE") else 0)
        text = f"scalar(init={_num32(init)}{offset})"
        return Out(f"{lift.declare(path, text, node)} * {{0}}", (c["X"],))
    if p.ndim == 1 and p.shape[0] == lift.shape(c["X"])[-1]:
        axis = lift.axes(c["X"])[-1]
        flat = p.detach()
        init = f", init={_num32(float(flat[0]) + (1 if c.get('ONE') else 0))}" if bool((flat == flat[0]).all()) else ""
        text = f"vector({axis}{init}{offset})"
        return Out(f"{lift.declare(path, text, node)} * {{0}}", (c["X"],))
    return None


def learned_gain_offset(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    return learned_gain(lift, node, {**c, "ONE": True})


def learned_bias(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    p = lift.param(c["G"])
    if not lift.is_tensor(c["X"]) or c["X"].op == "get_attr":
        return None
    path = lift.param_path(c["G"])
    if p.numel() == 1 and p.ndim <= 1:  # one learned number (Fixup's scalar biases)
        text = f"bias(init={_num32(float(p.detach().reshape(())))})"
    elif p.ndim == 1 and p.shape[0] == lift.shape(c["X"])[-1]:
        text = f"bias({lift.axes(c['X'])[-1]})"
    else:
        return None
    return Out(f"{{0}} + {lift.declare(path, text, node)}", (c["X"],))


def _tensors(lift: "Lifter", *nodes: Any) -> bool:
    return all(lift.is_tensor(n) and n.op != "get_attr" for n in nodes)


def binary(symbol: str) -> Builder:
    def build(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
        return Out(f"{{0}} {symbol} {{1}}", (c["A"], c["B"])) if _tensors(lift, c["A"], c["B"]) else None
    return build


def complement(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    return Out("1 - {0}", (c["Z"],)) if _tensors(lift, c["Z"]) else None


def concat(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    """States joined along their feature axis: the joined width is a model axis of its own (``dim E``)."""
    parts = c["L"]
    if not isinstance(parts, (list, tuple)) or len(parts) < 2 or not _tensors(lift, *parts) or \
            _dim_index(lift, parts[0], c["DIM"]) != 2 or any(lift.rank(p) != 3 for p in parts):
        return None
    lift.session.joined(lift.shape(node)[-1])
    return Out(f"concat({', '.join(f'{{{i}}}' for i in range(len(parts)))})", tuple(parts))


def function(name: str) -> Builder:
    def build(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
        return Out(f"{name}({{0}})", (c["X"],)) if _tensors(lift, c["X"]) else None
    return build


def gelu(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    return Out(("gelu_tanh" if c["A"] == "tanh" else "gelu") + "({0})", (c["X"],))


def same(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    """A copy or a cast that keeps the dtype: the lifted value is its input."""
    if not _tensors(lift, c["X"]) or lift.dtype(c["X"]) != lift.dtype(node) or lift.shape(c["X"]) != lift.shape(node):
        return None
    return Out("", (c["X"],))


def cast(lift: "Lifter", node: fx.Node, c: dict[str, Any]) -> Out | None:
    if not _tensors(lift, c["X"]) or lift.dtype(node) not in _DTYPES:
        return None
    return Out(f"cast({{0}}, {_DTYPES[lift.dtype(node)]})", (c["X"],))


_RMS = "mul(cast?(X), rsqrt(add(R:mean(pow(cast?(X), 2), AXIS, KEEP), EPS)))"
_RMS_DIV = "div(cast?(X), sqrt(add(R:mean(pow(cast?(X), 2), AXIS, KEEP), EPS)))"
_RMS_SQ = "mul(cast?(X), rsqrt(add(R:mean(mul(cast?(X), cast?(X)), AXIS, KEEP), EPS)))"  # x * x: litgpt
_LN = ("add(mul(cast?(W@param), mul(sub(cast?(X), M:mean(cast?(X), _, _)), "
       "rsqrt(add(R:mean(pow(sub(cast?(X), M), 2), _, _), EPS)))), cast?(BIAS@param))")
_LN_VAR = ("add(mul(cast?(W@param), div(sub(cast?(X), M:mean(cast?(X), _, _)), "
           "sqrt(add(R:var(cast?(X), _, _, _), EPS)))), cast?(BIAS@param))")

# name, pattern, builder: one rule a line, tried in this order
TABLE: tuple[tuple[str, str, Builder], ...] = (
    ("layer_norm", "layer_norm(X, SHAPE, W, BIAS, EPS)", layer_norm),
    ("rms_norm", "rms_norm(X, SHAPE, W, EPS)", rms_norm),
    ("F.normalize", "normalize(X, P, DIM, EPS)", l2_normalize),
    ("rms written out", f"O:cast?(mul(cast?(W@param), I:cast?({_RMS})))", rmsnorm),
    ("rms written out 1+w", f"O:cast?(mul(add(1, cast?(W@param)), I:cast?({_RMS})))", rmsnorm_offset),
    ("rms x * x", f"O:cast?(mul(cast?(W@param), I:cast?({_RMS_SQ})))", rmsnorm),
    ("rms x * x 1+w", f"O:cast?(mul(cast?(add(1, cast?(W@param))), I:cast?({_RMS_SQ})))", rmsnorm_offset),
    ("rms div", f"O:cast?(mul(cast?(W@param), I:cast?({_RMS_DIV})))", rmsnorm),
    ("rms div 1+w", f"O:cast?(mul(add(1, cast?(W@param)), I:cast?({_RMS_DIV})))", rmsnorm_offset),
    ("layer norm written out", _LN, layernorm_hand),
    ("layer norm var", _LN_VAR, layernorm_hand),
    ("dyt written out", "add(mul(W@param, tanh(mul(A@param, X))), BIAS@param)", dyt),
    ("blockir rmsnorm", "blockir_rms_norm(X, W, EPS, OFFSET, CAST, ACCUM, FEATURES)", compiled_rms_norm),
    ("blockir layernorm", "blockir_layer_norm(X, W, BIAS, EPS, ACCUM, OFFSET, TWO_PASS, RECENTER, UPCAST)",
     compiled_layer_norm),
    ("blockir norm", "blockir_norm(X)", compiled_norm),
    ("blockir norm on its module", "blockir_family_norm(X, _, M@param)", compiled_family_norm),
    ("blockir dropout", "blockir_dropout(X, P, MASK, _, _, _, SITE)", compiled_dropout),
    ("dropout", "dropout(X, P, _, _)", dropout),
    ("drop_path", "mul(X, M)", drop_path),
    ("drop_path keep", "mul(div(X, _), M)", drop_path),
    ("gain 1+g", "mul(add(1, G@param), X)", learned_gain_offset),
    ("gain", "mul(G@param, X)", learned_gain),
    ("scale", "mul(X, C@const)", scale),
    ("scale div", "div(X, C@const)", scale_div),
    ("bias", "add(X, G@param)", learned_bias),
    ("concat", "cat(L, DIM)", concat),
    ("complement", "sub(1, Z)", complement),
    ("complement rsub", "rsub(Z, 1)", complement),
    ("residual add", "add(A, B)", binary("+")),
    ("product", "mul(A, B)", binary("*")),
    ("difference", "sub(A, B)", binary("-")),
    ("relu", "relu(X)", function("relu")),
    ("gelu", "gelu(X, A)", gelu),
    ("silu", "silu(X)", function("silu")),
    ("tanh", "tanh(X)", function("tanh")),
    ("sigmoid", "sigmoid(X)", function("sigmoid")),
    ("erf", "erf(X)", function("erf")),
    ("copy", "same(X)", same),
    ("reshape to the same shape", "reshape(X)", same),
    ("same dtype", "cast(X, _)", same),
    ("cast", "cast(X, _)", cast),
)
RULES: tuple[tuple[str, Pat, Builder], ...] = tuple((n, compile_pattern(p), b) for n, p, b in TABLE)
