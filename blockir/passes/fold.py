"""The fold pass: inference-only scales, norm affines and dropouts disappear into the linears next to
them. The pass rewrites the IR and writes the weight edits that keep the function; a compiled
module's weights take them in :mod:`blockir.lower.fold`.

Fold legality (:mod:`blockir.analyses.fold_legality`) is the proof: a site is folded only when
its report marks it legal, and only when the parameters this rewrite would edit are exactly
the ones the proof named; anything else is kept and logged with the reason. ``RULES`` holds one
rule per line with the algebra it relies on (x̂ is the normalized value, c a constant scale that
stays between the norm and the linear).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from blockir.analyses.fold_legality import (
    FIRST_LINEAR,
    LAST_LINEAR,
    FoldSite,
    fold_report,
    stored_names,
)
from blockir.norms import family
from blockir.analyses.sizes import Sizes
from blockir.analyses.structure import decl_kind
from blockir.ir.decls import KindDecl
from blockir.ir.op import OpBase
from blockir.ir.program import Block, Program
from blockir.ir.traits import Calls, Scales, Stochastic
from blockir.ops import Op
from blockir.passes.fold_edits import (
    Drop,
    Edit,
    FoldStatistics,
    Gain,
    ScaleInputs,
    ScaleNormState,
    ScaleOutputs,
    ShiftBias,
)
from blockir.passes.manager import Pass, PassResult
from blockir.passes.op_kinds import plain_norm


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str  # the fold-legality site kind it acts on
    algebra: str


RULES: tuple[Rule, ...] = (
    Rule("dropout", "dropout", "dropout(x) = drop_path(x) = layer_drop(x) = x in inference"),
    Rule("scale-into-linear", "scale", "s ⊙ (W x + b) = (diag(s) W) x + s ⊙ b"),
    Rule("scale-into-norm", "scale",
         "s ⊙ (γ ⊙ x̂ + β) = (s ⊙ γ) ⊙ x̂ + s ⊙ β; with (1 + w): w' = s ⊙ (1 + w) - 1"),
    Rule("scale-into-consumers", "scale", "W (s ⊙ x) + b = (W diag(s)) x + b"),
    Rule("affine-into-linears", "affine",
         "W c (γ ⊙ x̂ + β) + b = (W diag(γ)) c x̂ + (b + c W β); γ = 1 + w for offset=1"),
    Rule("statistics-into-linears", "statistics",
         "W (s ⊙ x + t) + b = (W diag(s)) x + (b + W t); s = γ/σ + η, t = β - γ μ/σ (running μ, σ)"),
)
RULE = {r.name: r for r in RULES}
# dropouts go first so that the scales and affines behind them see their real neighbours
ORDER = {"dropout": 0, "scale": 1, "affine": 2, "statistics": 2}
# which ops a fold-legality site kind names
SITE_OPS: dict[str, Callable[[OpBase], bool]] = {
    "dropout": lambda op: op.has(Stochastic), "scale": lambda op: op.has(Scales),
    "affine": plain_norm, "statistics": plain_norm}


@dataclass(frozen=True)
class FoldEvent:
    """One site: the rule that fired, or the code and reason it was kept."""

    site: FoldSite
    fired: bool
    rule: str | None = None
    code: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class FoldLog:
    """What the fold pass finds beside the program: the weight edits in the order they apply, and the log
    (the folds that fired, then every site kept, with its reason)."""

    edits: tuple[Edit, ...]
    report: tuple[FoldEvent, ...]


@dataclass(frozen=True)
class _Step:
    block: Block
    rule: str
    edits: tuple[Edit, ...]


class _Refuse(Exception):
    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _key(site: FoldSite) -> tuple[Any, ...]:
    return (site.kind, site.name, site.span.line, site.span.column)


def _param_key(decl: str, linear: str, leaf: str) -> str:
    return f"{decl}.{linear}.{leaf}" if linear else f"{decl}.{leaf}"


def _weightless(block: Block, op: Op) -> bool:
    decl = block.decl_map.get(getattr(op, "decl", "") or "")
    return isinstance(decl, KindDecl) and decl.category == "norm" and not family(decl).weight(decl)


def _sites(block: Block, mode: str) -> list[tuple[FoldSite, Op]]:
    """The report's sites paired with their ops (both are in program order); an RMSNorm whose
    weight was already folded is no longer an affine site."""
    candidates = iter(op for op in block.ops if any(is_site(op) for is_site in SITE_OPS.values()))
    out = []
    for site in fold_report(block, mode):
        for op in candidates:
            if SITE_OPS[site.kind](op) and (not plain_norm(op) or op.decl == site.name):  # type: ignore[union-attr]
                if not (site.kind == "affine" and _weightless(block, op)):
                    out.append((site, op))
                break
    return out


def _remove(block: Block, op: Any) -> Block:
    """Drop an op that became the identity; its users read its operand instead."""
    return replace(block, ops=tuple(o.reading({op.result: op.operand}) for o in block.ops if o is not op))


def _with_args(decl: KindDecl, **updates: Any) -> KindDecl:
    # spec order and no unset values: exactly what the builder stores, so printing round-trips
    merged = ((a.name, updates.get(a.name, decl.arg(a.name))) for a in decl.spec.args)
    return replace(decl, args=tuple((k, v) for k, v in merged if v is not None))


def _check(site: FoldSite, keys: list[str]) -> None:
    if set(keys) != set(site.into):
        raise _Refuse("unproven", f"the rewrite would edit {', '.join(sorted(set(keys)))}, but fold legality "
                      f"proved only {', '.join(site.into)}")


def _linear_inputs(block: Block, value: str, sizes: Sizes) -> list[tuple[str, str | None, float]]:
    """(weight, bias or None, constant factor on the way) of every input-side linear reading ``value``."""
    out: list[tuple[str, str | None, float]] = []
    stack = [(value, 1.0)]
    while stack:
        v, c = stack.pop()
        for user in block.users.get(v, ()):
            if user.has(Stochastic):
                stack.append((user.result, c))
                continue
            if user.has(Scales) and user.factor is not None:  # type: ignore[union-attr]
                stack.append((user.result, c * float(sizes.value(user.factor))))  # type: ignore[union-attr]
                continue
            kind = decl_kind(block, user)
            if not user.has(Calls) or kind not in FIRST_LINEAR:
                raise _Refuse("unproven", f"'{user.result}' reads the value but is not an input-side linear")
            has_bias = bool(block.decl_map[user.decl].arg("bias"))  # type: ignore[union-attr]
            per_arg = FIRST_LINEAR[kind]
            for i in (i for i, a in enumerate(user.args) if a == v):
                for n in stored_names(block.decl_map[user.decl], per_arg[min(i, len(per_arg) - 1)]):
                    out.append((_param_key(user.decl, n, "weight"),
                                _param_key(user.decl, n, "bias") if has_bias else None, c))
    return out


def _drop_unused_param(block: Block, param: str | None) -> tuple[Block, tuple[Edit, ...]]:
    # a fused add+norm can still apply the same gain as its branch_param
    if param is None or any(param in (getattr(op, "param", None), getattr(op, "branch_param", None))
                            for op in block.ops):
        return block, ()
    return replace(block, decls=tuple(d for d in block.decls if d.name != param)), (Drop(param),)


def _norm_key(decl: KindDecl, role: str) -> str:
    """The state-dict key of a norm's gain or shift, under the name the declaration gives it."""
    return f"{decl.name}.{family(decl).names(decl).get(role, role)}"


def _into_norm(block: Block, site: FoldSite, norm: Any, gain: Gain, op: Any) -> tuple[Edit, ...]:
    decl = block.decl_map[norm.decl]
    assert isinstance(decl, KindDecl)
    if _weightless(block, norm):
        raise _Refuse("no_weight", f"the norm '{decl.name}' has no weight left to absorb it")
    if family(decl).scale_kind == "scalar":
        param = block.decl_map.get(op.param or "")
        if isinstance(param, KindDecl) and param.kind == "vector":
            raise _Refuse("shape", f"a per-channel gain cannot fold into the single scalar of '{decl.name}'")
        _check(site, [_norm_key(decl, "scale")])
        return (ScaleNormState(_norm_key(decl, "scale"), None, int(decl.arg("offset", 0)), gain),)
    bias = _norm_key(decl, "bias") if family(decl).bias(decl) else None
    _check(site, [_norm_key(decl, "weight")] + ([bias] if bias else []))
    return (ScaleNormState(_norm_key(decl, "weight"), bias, int(decl.arg("offset", 0)), gain),)


def _into_linear(block: Block, site: FoldSite, prod: Any, gain: Gain) -> tuple[Edit, ...]:
    decl = block.decl_map[prod.decl]
    assert isinstance(decl, KindDecl)
    has_bias = decl.arg("out_bias" if decl.kind in ("self_attention", "cross_attention") else "bias")
    edits = [ScaleOutputs(_param_key(decl.name, n, "weight"), _param_key(decl.name, n, "bias") if has_bias else None,
                          gain) for n in stored_names(decl, LAST_LINEAR[decl.kind])]
    _check(site, [e.weight for e in edits] + [e.bias for e in edits if e.bias])
    return tuple(edits)


def _fold_scale(block: Block, site: FoldSite, op: Any, sizes: Sizes) -> _Step:
    param = block.decl_map.get(op.param or "")
    gain = Gain(const=float(sizes.value(op.factor))) if op.factor is not None else \
        Gain(key=op.param, offset=int(param.arg("offset", 0)) if isinstance(param, KindDecl) else 0)
    prod = block.producers.get(op.operand)
    producer_side = site.action.startswith("fold into the producer")
    if producer_side and prod is not None and plain_norm(prod):
        rule, edits = "scale-into-norm", _into_norm(block, site, prod, gain, op)
    elif producer_side and prod is not None and prod.has(Calls) and decl_kind(block, prod) in LAST_LINEAR:
        rule, edits = "scale-into-linear", _into_linear(block, site, prod, gain)
    elif not producer_side:
        linears = _linear_inputs(block, op.result, sizes)
        _check(site, [w for w, _, _ in linears])
        weights = dict.fromkeys(w for w, _, _ in linears)
        rule, edits = "scale-into-consumers", tuple(ScaleInputs(w, gain) for w in weights)
    else:
        raise _Refuse("unproven", f"the producer of '{op.operand}' is not a norm or a known final linear")
    folded, dropped = _drop_unused_param(_remove(block, op), op.param)
    return _Step(folded, rule, edits + dropped)


def _fold_affine(block: Block, site: FoldSite, op: Any, sizes: Sizes) -> _Step:
    decl = block.decl_map[op.decl]
    assert isinstance(decl, KindDecl)
    if family(decl).unaffine is None:
        raise _Refuse("no_form", f"the language has no affine-free {decl.kind}, so its state has nowhere to go")
    shift = family(decl).bias(decl)
    linears = _linear_inputs(block, op.result, sizes)
    _check(site, [w for w, _, _ in linears] + ([b for _, b, _ in linears if b] if shift else []))
    weight, bias = _norm_key(decl, "weight"), _norm_key(decl, "bias")
    # the bias shift reads W before its columns are scaled
    edits: list[Edit] = [ShiftBias(w, b, Gain(key=bias), c) for w, b, c in linears if shift and b]
    edits += [ScaleInputs(w, Gain(key=weight, offset=int(decl.arg("offset", 0)))) for w in dict.fromkeys(
        w for w, _, _ in linears)]
    edits += [Drop(weight)] + ([Drop(bias)] if shift else [])
    plain = _with_args(decl, **family(decl).unaffine)
    folded = replace(block, decls=tuple(plain if d.name == decl.name else d for d in block.decls))
    return _Step(folded, "affine-into-linears", tuple(edits))


def _fold_statistics(block: Block, site: FoldSite, op: Any, sizes: Sizes) -> _Step:
    decl = block.decl_map[op.decl]
    assert isinstance(decl, KindDecl)
    linears = _linear_inputs(block, op.result, sizes)
    if any(b is None for _, b, _ in linears):
        raise _Refuse("no_bias", "every linear reading the norm needs a bias to take its shift")
    _check(site, [w for w, _, _ in linears] + [b for _, b, _ in linears if b])
    shape = (1,)  # the keys are what matters here; the shapes live in the state dict
    fam = family(decl)
    prefix = fam.statistics_prefix
    edit = FoldStatistics(decl.name, prefix, float(sizes.value(decl.arg("eps"))),
                          int(sizes.value(decl.arg("steps"))) if fam.transitions else None,
                          tuple((w, b, c) for w, b, c in linears if b is not None), decl.span, fam.name)
    drops = tuple(Drop(f"{decl.name}.{k}") for k, _ in fam.keys(decl, shape) + fam.buffers(decl, shape))
    gone = replace(block, decls=tuple(d for d in block.decls if d.name != decl.name),
                   ops=tuple(o.reading({op.result: op.operand}) for o in block.ops if o is not op))
    return _Step(gone, "statistics-into-linears", (edit, *drops))


def _fold_dropout(block: Block, site: FoldSite, op: Any, sizes: Sizes) -> _Step:
    return _Step(_remove(block, op), "dropout", ())


# how each fold-legality site kind folds the op it names
FOLDS: dict[str, Callable[[Block, FoldSite, Any, Sizes], _Step]] = {
    "dropout": _fold_dropout, "scale": _fold_scale, "affine": _fold_affine, "statistics": _fold_statistics}


def fold_block(program: Program, block_name: str, mode: str = "infer", *,
               dims: Mapping[str, int] | None = None) -> tuple[Program, list[Edit], tuple[FoldEvent, ...]]:
    """Fold every legal site of one block, one at a time, re-proving legality after each rewrite.

    Returns the new program, the weight edits in the order they apply, and the log: the folds
    that fired, then every site kept, with its reason.
    """
    block = program.block(block_name)
    sizes = Sizes.of(program, dims).for_block(block, 0, 1)
    fired: list[FoldEvent] = []
    edits: list[Edit] = []
    refused: dict[tuple[Any, ...], FoldEvent] = {}
    while True:
        todo = [(s, op) for s, op in _sites(block, mode) if s.legal and _key(s) not in refused]
        if not todo:
            break
        site, op = min(todo, key=lambda pair: ORDER[pair[0].kind])
        try:
            step = FOLDS[site.kind](block, site, op, sizes)
        except _Refuse as no:
            refused[_key(site)] = FoldEvent(site, False, code=no.code, reason=no.reason)
            continue
        block = step.block
        edits += step.edits
        fired.append(FoldEvent(site, True, rule=step.rule))
    kept = [refused.get(_key(s), FoldEvent(s, False, code=s.code, reason=s.reason))
            for s, _ in _sites(block, mode) if not s.legal or _key(s) in refused]
    blocks = tuple(block if b.name == block_name else b for b in program.blocks)
    return replace(program, blocks=blocks), edits, tuple(fired + kept)


def fold_pass(block_name: str, mode: str = "infer", dims: Mapping[str, int] | None = None) -> Pass[FoldLog]:
    """:func:`fold_block` as a pass; it changed the program when a fold fired."""
    def rewrite(program: Program) -> PassResult[FoldLog]:
        folded, edits, report = fold_block(program, block_name, mode, dims=dims)
        return PassResult(folded, any(e.fired for e in report), FoldLog(tuple(edits), report))
    return Pass("fold", rewrite)


def format_log(block_name: str, mode: str, report: tuple[FoldEvent, ...]) -> str:
    """One line per site: where, what, and the rule that fired or the reason it was kept."""
    lines = [f"folds of {block_name} (mode {mode})"]
    if not report:
        lines.append("  nothing to fold: no scales, affine norms or dropouts")
    width = max((len(e.site.name) for e in report), default=0)
    at = max((len(str(e.site.span)) for e in report), default=0)
    for e in report:
        head = f"  {str(e.site.span):<{at}}  {e.site.kind:<8} {e.site.name:<{width}}"
        if e.fired:
            assert e.rule is not None
            lines.append(f"{head}  fired  {e.rule}: {RULE[e.rule].algebra}")
        else:
            lines.append(f"{head}  kept   [{e.code}] {e.reason}")
    return "\n".join(lines)
