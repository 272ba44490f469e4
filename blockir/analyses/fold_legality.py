"""Fold legality: which scales, norm affines and dropouts may fold into a linear, and where.

A report, not diagnostics (docs/folds.md: a scale folds into a weight only if
that preserves dtype, quantization and weight sharing):

    dropout(x)  -> x                      in inference, always
    s * L(x)    -> L'(x), W' = s W, b' = s b    the producer ends with a linear L
    L(s * x)    -> L'(x), W' = W s              every consumer starts with a linear
    L(γ x̂ + β) -> L'(x̂), W' = W diag(γ), b' = W β + b
    L(BN(x))    -> L'(x),  BN(x) = s x + t under fixed running moments: W' = W diag(s), b' = W t + b

and exactly why not otherwise: training mode, a nonlinearity in between, a
consumer that is not linear (the residual shortcut), a tied norm or shared
weight, half-precision storage that would round the product, a producer
bound from Python, or a shortcut scale whose operand also feeds the branch
(DeepNorm's alpha multiplies both paths of the next update).
"""
from __future__ import annotations

from dataclasses import dataclass

from blockir.norms import family
from blockir.analyses.structure import decl_kind, describe, wrapper
from blockir.diagnostics import Span
from blockir.ir.consts import format_expr
from blockir.ir.decls import KindDecl
from blockir.ir.kinds import LAYER_NAMES, layer_names
from blockir.analyses.block_queries import applies_norm, has
from blockir.ir.traits import Calls, Function, ResidualSum, Scales, Sink, Stochastic
from blockir.ops import Op
from blockir.ir.printer import format_op
from blockir.ir.program import Block

# the linear a built-in ends with (output side) and those it starts with (input side, per argument)
LAST_LINEAR = {"self_attention": ("o_proj",), "cross_attention": ("o_proj",), "mlp": ("fc2",),
               "gated_mlp": ("down_proj",), "linear": ("",)}
FIRST_LINEAR = {"self_attention": (("q_proj", "k_proj", "v_proj"),),
                "cross_attention": (("q_proj",), ("k_proj", "v_proj")),  # per argument: queries, memory
                "mlp": (("fc1",),), "gated_mlp": (("gate_proj", "up_proj"),), "linear": (("",),),
                "head": (("",),)}  # an untied LM head is a linear over the model axis (a final norm folds into it)


def stored_names(decl: KindDecl, names: tuple[str, ...]) -> tuple[str, ...]:
    """The default layer names of ``FIRST_LINEAR``/``LAST_LINEAR`` under the names the declaration gives them
    (``q=self.query``); raises _No where the layers are not stored as separate ``[out, in]`` matrices."""
    if decl.arg("conv1d") or decl.arg("fused") not in (None, False, "none"):
        raise _No("layout", f"'{decl.name}' stores its projections fused or transposed ([in, out]), which the "
                  "fold does not rescale")
    role = {default: r for r, default in LAYER_NAMES.get(decl.kind, {}).items()}
    given = layer_names(decl.kind, dict(decl.args))
    return tuple(given[role[n]] if n in role else n for n in names)


@dataclass(frozen=True)
class FoldSite:
    kind: str  # scale | affine | dropout | statistics
    name: str  # the scale or norm declaration, or the dropout's op text
    span: Span
    legal: bool
    action: str  # what folding does; "keep" when it may not
    into: tuple[str, ...] = ()  # parameters it folds into
    # training | nonlinearity | not_linear | shortcut | tied | shared_weight | rounding | opaque | no_bias | layout
    # | live_statistics
    code: str | None = None
    reason: str | None = None


class _No(Exception):
    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _keys(decl: str, names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{decl}.{n}" if n else decl for n in names)


def _sites(block: Block, decl: str) -> int:
    return sum(getattr(op, "decl", None) == decl for op in block.ops)


def _kind_decl(block: Block, op: Op) -> KindDecl | None:
    d = block.decl_map.get(getattr(op, "decl", "") or "")
    return d if isinstance(d, KindDecl) else None


def _exact(block: Block, value: str) -> None:
    t = block.type_of(value)
    if t.dtype is not None and t.dtype.is_half:
        raise _No("rounding", f"the weights are stored in {t.dtype.value}: the folded product rounds, so the fold is "
                  "not exact")


def _through(block: Block, v: str) -> str:
    """Walk back over ops that are the identity in inference (dropout) to the real producer."""
    op = block.producers.get(v)
    while has(op, Stochastic):
        v = op.operand
        op = block.producers.get(v)
    return v


def _into_producer(block: Block, op: Op) -> tuple[str, ...]:
    """Parameters a scale folds into on its producer's output side; raises _No with the reason."""
    v = _through(block, op.operand)
    prod = block.producers.get(v)
    if len(block.users.get(v, ())) > 1:
        raise _No("not_linear", f"{describe(block, v)} also feeds another op, which the folded weight would scale too")
    if has(prod, Function) or prod is not None and decl_kind(block, prod) == "activation":
        raise _No("nonlinearity", f"the nonlinearity {describe(block, v)} lies between it and the linear")
    if applies_norm(prod):
        return _into_norm(block, prod)
    kind = decl_kind(block, prod) if prod is not None else None
    if not has(prod, Calls) or kind not in LAST_LINEAR:
        if kind in ("extern", "block", "stack"):
            raise _No("opaque", f"its producer {describe(block, v)} is bound from Python or a block: its last op "
                      "is unknown")
        raise _No("not_linear", f"its producer {describe(block, v)} does not end with a linear")
    if _sites(block, prod.decl) > 1:
        raise _No("shared_weight", f"'{prod.decl}' is applied at several sites; its weight is shared")
    decl = block.decl_map[prod.decl]
    bias = decl.arg("out_bias" if kind in ("self_attention", "cross_attention") else "bias")
    last = stored_names(decl, LAST_LINEAR[kind])
    names = [f"{n}.weight" if n else "weight" for n in last]
    names += [f"{n}.bias" if n else "bias" for n in last] if bias else []
    return _keys(prod.decl, tuple(names))


def _into_norm(block: Block, norm: Op) -> tuple[str, ...]:
    decl = _kind_decl(block, norm)
    if decl is None or not family(decl).weight(decl):
        raise _No("not_linear", f"the norm {describe(block, norm.result)} has no affine state to absorb it")
    if decl.arg("tied") or _sites(block, decl.name) > 1:
        raise _No("tied", f"the norm '{decl.name}' is applied at several sites")
    if family(decl).batch_coupled:
        raise _No("not_linear", f"the norm '{decl.name}' is batch-coupled: a gain on its output would have to scale "
                  "its running moments' map, which its parameters alone do not hold")
    return _keys(decl.name, family(decl).affine_keys(decl))


def _into_consumers(block: Block, value: str, what: str, with_bias: bool) -> tuple[str, ...]:
    """Parameters a multiplier on ``value`` folds into on its consumers' input side."""
    keys: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        for user in block.users.get(v, ()):
            if has(user, Stochastic) or has(user, Scales) and user.factor is not None:
                stack.append(user.result)  # the identity in inference / a constant that commutes with the fold
                continue
            keys += _consumer(block, user, v, what, with_bias)
    return tuple(keys)


def _consumer(block: Block, user: Op, v: str, what: str, with_bias: bool) -> list[str]:
    if has(user, ResidualSum):
        raise _No("not_linear", f"{what} reaches the residual add {format_op(user)!r}, which is not a linear layer")
    if has(user, Sink):
        raise _No("not_linear", f"{what} is the block's output; no linear follows inside the block")
    if has(user, Function) or decl_kind(block, user) == "activation":
        raise _No("nonlinearity", f"the nonlinearity {describe(block, user.result)} lies between it and the linear")
    kind = decl_kind(block, user)
    if not has(user, Calls) or kind not in FIRST_LINEAR:
        if kind in ("extern", "block", "stack"):
            raise _No("opaque", f"its consumer {describe(block, user.result)} is bound from Python or a block: its "
                      "first op is unknown")
        raise _No("not_linear", f"its consumer {describe(block, user.result)} is not linear")
    if _sites(block, user.decl) > 1:
        raise _No("shared_weight", f"'{user.decl}' is applied at several sites; its weight is shared")
    decl = block.decl_map[user.decl]
    if kind == "head" and decl.arg("tied"):
        raise _No("tied", f"the head '{user.decl}' shares its weight with the token embedding, which the fold would "
                  "scale too")
    names = stored_names(decl, FIRST_LINEAR[kind][min(user.args.index(v), len(FIRST_LINEAR[kind]) - 1)])
    if with_bias and not decl.arg("bias"):
        raise _No("no_bias", f"folding the shift needs a bias on '{user.decl}', which has none")
    suffixes = ("weight", "bias") if with_bias else ("weight",)
    return list(_keys(user.decl, tuple((n + "." if n else "") + x for n in names for x in suffixes)))


def _scale_site(block: Block, op: Op, mode: str, shortcut_of: dict[int, str]) -> FoldSite:
    name = f"{format_expr(op.factor, 2)} * {op.operand}" if op.factor is not None else str(op.param)
    if mode == "train":
        return FoldSite("scale", name, op.span, False, "keep", (), "training",
                        "training mode: the optimizer updates the scale and the weight separately")
    if id(op) in shortcut_of:
        two_sided = ("; DeepScaleLM's lambda on this Post-LN block folds two-sided instead, into the gains of the "
                     "norms that produce the stream and over the branches' first linears "
                     "(blockir.lower.fold.fold_deepscalelm)") if _deepscalelm_post_ln(block) else ""
        return FoldSite("scale", name, op.span, False, "keep", (), "shortcut",
                        f"it scales the shortcut '{op.operand}', which also feeds the branch "
                        f"'{shortcut_of[id(op)]}': folding it upstream would scale both paths{two_sided}")
    try:
        _exact(block, op.operand)
    except _No as no:
        return FoldSite("scale", name, op.span, False, "keep", (), no.code, no.reason)
    try:
        into = _into_producer(block, op)
        return FoldSite("scale", name, op.span, True, "fold into the producer's output", into)
    except _No as first:
        try:
            into = _into_consumers(block, op.result, f"'{name}'", False)
            return FoldSite("scale", name, op.span, True, "fold into the consumers' input", into)
        except _No:
            return FoldSite("scale", name, op.span, False, "keep", (), first.code, first.reason)


def _affine_site(block: Block, op: Op, mode: str) -> FoldSite | None:
    decl = _kind_decl(block, op)
    if decl is None or not family(decl).weight(decl):
        return None  # already affine-free: nothing to fold
    params = " and ".join(family(decl).affine_keys(decl)) + family(decl).affine_note
    label = decl.name
    if mode == "train":
        return FoldSite("affine", label, op.span, False, "keep", (), "training",
                        "training mode: the affine state is trained separately")
    try:
        if decl.arg("tied") or _sites(block, decl.name) > 1:
            raise _No("tied", f"the norm is applied at {_sites(block, decl.name)} sites; folding changes every one")
        if family(decl).fold_rounds(decl):
            _exact(block, op.operand)
        shift = family(decl).bias(decl)
        into = _into_consumers(block, op.result, f"the output of '{decl.name}'", shift)
        return FoldSite("affine", label, op.span, True, f"fold {params} into the consumers' input", into)
    except _No as no:
        return FoldSite("affine", label, op.span, False, "keep", (), no.code, no.reason)


def _statistics_site(block: Block, op: Op, decl: KindDecl, mode: str) -> FoldSite:
    """A batch-coupled norm is, with its running moments fixed, one per-channel map s x + t (RepBN's eta
    included): all of it folds into the linears that read it (Guo et al., arXiv:2405.11582)."""
    if mode == "train":
        return FoldSite("statistics", decl.name, op.span, False, "keep", (), "training",
                        "training mode: the moments are the batch's own and the running ones still move")
    try:
        if not decl.arg("running"):
            raise _No("live_statistics", "running=false: evaluation normalizes with each batch's own moments, so "
                      "there is no fixed map to fold")
        if decl.arg("tied") or _sites(block, decl.name) > 1:
            raise _No("tied", f"the norm is applied at {_sites(block, decl.name)} sites; folding changes every one")
        into = _into_consumers(block, op.result, f"the output of '{decl.name}'", True)
        share = family(decl).statistics_note
        return FoldSite("statistics", decl.name, op.span, True,
                        f"fold {share}with calibrated running moments, into the consumers' input", into)
    except _No as no:
        return FoldSite("statistics", decl.name, op.span, False, "keep", (), no.code, no.reason)


def _dropout_site(op: Op, mode: str) -> FoldSite:
    name = f"{op.function}({op.operand})"
    if mode == "train":
        return FoldSite("dropout", name, op.span, False, "keep", (), "training", "dropout is active in training")
    return FoldSite("dropout", name, op.span, True, "remove: the identity in inference")


def _batch_coupled(block: Block, op: Op) -> bool:
    decl = _kind_decl(block, op)
    return decl is not None and family(decl).batch_coupled


def _deepscalelm_post_ln(block: Block) -> bool:
    """A block stating ``deepscalelm = 1`` whose every update is Post-LN: its skip scale folds two-sided."""
    subs = wrapper(block).sublayers
    return any(c.name == "deepscalelm" for c in block.consts) and bool(subs) and \
        all(s.post_norm is not None for s in subs)


def fold_report(block: Block, mode: str) -> list[FoldSite]:
    """One entry per scale, affine norm, batch-coupled norm and dropout of ``block``, in program order."""
    if mode not in ("train", "infer"):
        raise ValueError(f"mode must be 'train' or 'infer', got {mode!r}")
    shortcut_of = {id(op): s.branches[0].name for s in wrapper(block).sublayers if s.branches
                   for op in s.shortcut_ops if has(op, Scales)}
    out: list[FoldSite] = []
    for op in block.ops:
        if has(op, Scales):
            out.append(_scale_site(block, op, mode, shortcut_of))
        elif applies_norm(op) and _batch_coupled(block, op):
            out.append(_statistics_site(block, op, block.decl_map[op.decl], mode))  # type: ignore[arg-type]
        elif applies_norm(op):
            site = _affine_site(block, op, mode)
            if site is not None:
                out.append(site)
        elif has(op, Stochastic):
            out.append(_dropout_site(op, mode))
    return out


def format_report(block: Block, mode: str, sites: list[FoldSite]) -> str:
    lines = [f"{block.kind} {block.name} (mode {mode})"]
    if not sites:
        lines.append("  nothing to fold: no scales, affine norms or dropouts")
    width = max((len(s.name) for s in sites), default=0)
    at = max((len(str(s.span)) for s in sites), default=0)
    for s in sites:
        head = f"  {str(s.span):<{at}}  {s.kind:<8} {s.name:<{width}}"
        if s.legal:
            target = f" -> {', '.join(s.into)}" if s.into else ""
            lines.append(f"{head}  yes  {s.action}{target}")
        else:
            lines.append(f"{head}  no   [{s.code}] {s.reason}")
    return "\n".join(lines)
