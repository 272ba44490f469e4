"""Arguments that only make sense together with the sizes: attention heads against the model width, a
mixture's top_k against its experts.

Multi-head attention splits the width into ``heads`` slices of ``head_dim``
(unless ``head_dim`` is given), grouped-query attention shares each key/value
head among ``heads / kv_heads`` query heads, and the rotary embedding rotates
pairs of channels of each head. A size that breaks one of these would build
projections that do not line up and fail deep inside the forward, so the
verifier checks them wherever the sizes are known: at ``check`` with the
declared sizes, and again at compile time with the sizes given there.
"""
from __future__ import annotations

from typing import Mapping

from blockir.analyses.sizes import Env, contexts, layer_counts, program_env, uses_layer, value
from blockir.diagnostics import Diagnostic, Note, error
from blockir.ir import consts as C
from blockir.ir.decls import KindDecl
from blockir.ir.traits import Calls
from blockir.ir.program import Block, Program
from blockir.verifiers.registry import verifier

ATTENTION = ("self_attention", "cross_attention")
COUNTS = ("heads", "kv_heads", "head_dim")


def _width(block: Block, decl: KindDecl, env: Env) -> tuple[str, int] | None:
    """The name and size of the query width at the declaration's first use, when known."""
    use = next((op for op in block.ops if op.has(Calls) and op.decl == decl.name and op.args), None)
    if use is None:
        return None
    last = block.type_of(use.args[0]).last
    if last is None or not isinstance(env.get(last.name), int):
        return None
    return last.name, int(env[last.name])


def _attention(block: Block, decl: KindDecl, env: Env) -> Diagnostic | None:
    sizes: dict[str, int] = {}
    for name in COUNTS:
        expr = decl.arg(name)
        v = value(expr, env)
        if expr is None or v is None:
            continue
        if not float(v).is_integer() or v < 1:
            return error("E0212", f"{name} of '{decl.name}' must be a positive integer, got {v}", decl.span)
        sizes[name] = int(v)
    heads, kv = sizes.get("heads"), sizes.get("kv_heads")
    if heads is not None and kv is not None and heads % kv:
        return error("E0210", f"kv_heads={kv} of '{decl.name}' does not divide heads={heads}", decl.span,
                     hint="each key/value head serves heads / kv_heads query heads; pick a divisor of heads")
    width = _width(block, decl, env)
    head_dim = sizes.get("head_dim")
    if head_dim is None and heads is not None and width is not None:
        if width[1] % heads:
            return error("E0209", f"heads={heads} of '{decl.name}' does not divide its width {width[0]} = "
                         f"{width[1]}", decl.span, hint="pick a divisor of the width, or give head_dim=… explicitly")
        head_dim = width[1] // heads
    window = value(decl.arg("window"), env) if decl.arg("window") is not None else None
    if window is not None and (not float(window).is_integer() or window < 0):
        return error("E0802", f"window of '{decl.name}' must be a non-negative integer, got {window}", decl.span,
                     hint="a query sees this many keys, itself included; 0 means no window")
    if decl.arg("fused") == "qvk_groups":
        groups = value(decl.arg("qkv_groups"), env) if decl.arg("qkv_groups") is not None else 1
        if not float(groups).is_integer() or groups < 1 or (heads is not None and heads % groups) or \
                (kv is not None and kv != heads):
            return error("E0804", f"fused=qvk_groups of '{decl.name}' needs qkv_groups to divide heads={heads} and "
                         f"one key/value head per query head, got qkv_groups={groups}"
                         + (f", kv_heads={kv}" if kv is not None else ""), decl.span,
                         hint="each row group holds q, v and k of heads / qkv_groups heads (CodeGen: 4)")
    scaling = _rope_scaling(decl)
    if scaling is not None:
        return scaling
    p = value(decl.arg("dropout"), env) if decl.arg("dropout") is not None else None
    if p is not None and not 0 <= p < 1:
        return error("E0816", f"dropout of '{decl.name}' must lie in [0, 1), got {p}", decl.span,
                     hint="the probability of dropping an attention weight while training; 1 would drop every one")
    rotary = value(decl.arg("rotary_dim"), env) if decl.arg("rotary_dim") is not None else None
    if decl.arg("rope") and rotary is not None and head_dim is not None and \
            (not float(rotary).is_integer() or not 0 <= rotary <= head_dim or rotary % 2):
        return error("E0817", f"rotary_dim of '{decl.name}' must be an even integer from 0 to its head_dim "
                     f"{head_dim}, got {rotary}", decl.span,
                     hint="the rotary embedding rotates pairs among the first rotary_dim channels of each head")
    if decl.arg("rope") and head_dim is not None and head_dim % 2:
        return error("E0211", f"the rotary embedding of '{decl.name}' needs an even head_dim, got {head_dim}",
                     decl.span, hint="rotary embeddings rotate pairs of channels")
    return _longrope_factors(decl, rotary if rotary is not None else head_dim)


def _longrope_factors(decl: KindDecl, rotated: float | None) -> Diagnostic | None:
    """LongRoPE divides each rotated pair's frequency by its own factor: one positive factor per pair."""
    for name in ("rope_short_factor", "rope_long_factor"):
        factors = decl.arg(name)
        if factors is None:
            continue
        if rotated and len(factors) != int(rotated) // 2:  # 0: this layer rotates nothing
            return error("E0847", f"{name} of '{decl.name}' has {len(factors)} factors for {int(rotated)} rotated "
                         f"channels", decl.span, hint=f"give one factor per rotated pair: {int(rotated) // 2}")
        bad = next((f for f in factors if not f > 0), None)
        if bad is not None:
            return error("E0848", f"{name} of '{decl.name}' holds {bad:g}; every factor must be positive",
                         decl.span, hint="each factor divides a frequency")
    return None


SCALING_ARGS = ("rope_factor", "rope_original_max", "rope_low_freq", "rope_high_freq", "rope_beta_fast",
                "rope_beta_slow", "rope_attention_factor", "rope_short_factor", "rope_long_factor", "rope_recache")
SCALING_NEEDS = {"linear": ("rope_factor",), "llama3": ("rope_factor", "rope_original_max"),
                 "yarn": ("rope_factor", "rope_original_max"), "dynamic": ("rope_factor", "rope_original_max"),
                 "longrope": ("rope_factor", "rope_original_max", "rope_short_factor", "rope_long_factor")}
SCALING_TAKES = {"linear": ("rope_factor",),
                 "llama3": ("rope_factor", "rope_original_max", "rope_low_freq", "rope_high_freq"),
                 "yarn": ("rope_factor", "rope_original_max", "rope_beta_fast", "rope_beta_slow",
                          "rope_attention_factor"),
                 "dynamic": ("rope_factor", "rope_original_max"),
                 "longrope": ("rope_factor", "rope_original_max", "rope_attention_factor", "rope_short_factor",
                              "rope_long_factor", "rope_recache")}


def _rope_scaling(decl: KindDecl) -> Diagnostic | None:
    """A scaling scheme with the parameters it reads, and no parameter it ignores."""
    kind = decl.arg("rope_scaling")
    given = [a for a in SCALING_ARGS if decl.arg(a) is not None]
    if kind is None:
        if given:
            return error("E0801", f"'{decl.name}' sets {given[0]} but no rope_scaling", decl.span,
                         hint="rope_scaling=linear|llama3|yarn|dynamic|longrope chooses the scheme these parameters belong to")
        return None
    if not decl.arg("rope"):
        return error("E0801", f"'{decl.name}' sets rope_scaling={kind} but rope=false", decl.span,
                     hint="a scaling scheme rescales the rotary frequencies: add rope=true")
    missing = [a for a in SCALING_NEEDS[kind] if a not in given]
    if missing:
        return error("E0801", f"rope_scaling={kind} of '{decl.name}' needs {', '.join(missing)}", decl.span,
                     hint=f"{kind} reads: {', '.join(SCALING_TAKES[kind])}")
    extra = [a for a in given if a not in SCALING_TAKES[kind]]
    if extra:
        return error("E0801", f"rope_scaling={kind} of '{decl.name}' does not read {extra[0]}", decl.span,
                     hint=f"{kind} reads: {', '.join(SCALING_TAKES[kind])}")
    return None


def _moe(decl: KindDecl, env: Env) -> Diagnostic | None:
    """A mixture routes each token to ``top_k`` distinct experts of ``experts``; a shared gate needs a shared expert."""
    experts, top_k = value(decl.arg("experts"), env), value(decl.arg("top_k"), env)
    if experts is not None and (not float(experts).is_integer() or experts < 1):
        return error("E0121", f"experts of '{decl.name}' must be a positive integer, got {experts:g}", decl.span)
    if top_k is not None and (not float(top_k).is_integer() or top_k < 1
                              or (experts is not None and top_k > experts)):
        bound = f"from 1 to its {experts:g} experts" if experts is not None else "of at least 1"
        return error("E0121", f"top_k of '{decl.name}' must be an integer {bound}, got {top_k:g}", decl.span,
                     hint="each token is routed to top_k distinct experts")
    if decl.arg("shared_gate") and decl.arg("shared") is None:
        return error("E0122", f"shared_gate=true of '{decl.name}' gates a shared expert, and it has none",
                     decl.span, hint="give the shared expert's width, shared=…, or remove shared_gate")
    return None


def _padding_row(decl: KindDecl, env: Env) -> Diagnostic | None:
    """``padding_idx`` names a row of the table (negative: counted from the end, as nn.Embedding does)."""
    row = value(decl.arg("padding_idx"), env) if decl.arg("padding_idx") is not None else None
    rows = env.get(decl.arg("vocab"))
    if row is None or (float(row).is_integer() and (not isinstance(rows, int) or -rows <= row < rows)):
        return None
    return error("E0803", f"padding_idx={row} of '{decl.name}' is not a row of its table"
                 + (f" of {rows} rows" if isinstance(rows, int) else ""), decl.span,
                 hint="the id of the padding token: an integer below the vocabulary size")


def _width_of(names: list[str], env: Mapping[str, float | int]) -> int | None:
    sizes = [env.get(n) for n in names]
    return sum(int(s) for s in sizes) if all(isinstance(s, int) for s in sizes) else None  # type: ignore[arg-type]


def _joins(block: Block, env: Mapping[str, float | int], declared: Mapping[str, float | int]) -> list[Diagnostic]:
    """A linear that projects a concatenation (a U-Net skip) reads as many features as the parts have together.
    At the declared sizes the shape verifier judges it (E0207); here, sizes given at compile time that break it."""
    out = []
    for op in block.ops:
        d = block.decl_map.get(getattr(op, "decl", None) or "")
        if not (op.has(Calls) and isinstance(d, KindDecl) and d.kind == "linear" and op.args):
            continue
        last = block.type_of(op.args[0]).last
        if last is None or "+" not in last.name:
            continue
        parts, in_dim = last.name.split("+"), d.arg("in_dim")
        got, want = _width_of(parts, env), env.get(in_dim)
        if got is None or not isinstance(want, int) or got == want \
                or _width_of(parts, declared) != declared.get(in_dim):
            continue
        out.append(error("E0702", f"with the sizes given, linear '{d.name}' reads {in_dim} = {want} features, but "
                         f"what it projects joins {' + '.join(parts)} = {got}", op.span,
                         hint=f"a size given for one side of the join must be matched on the other: "
                              f"dims={{'{in_dim}': {got}}}, or leave both to the file"))
    return out


def _drop_rates(block: Block, base: Mapping[str, float | int], counts: tuple[int, ...]) -> list[Diagnostic]:
    """A drop probability written in ``layer`` lies in [0, 1) in every layer (a constant one is checked as the
    file is read, E0109)."""
    out = []
    for op in block.ops:
        p = getattr(op, "p", None)
        if not isinstance(p, C.EXPRS) or not uses_layer(p, block):
            continue
        for layer, n, env in contexts(base, block, counts, True):
            v = value(p, env)
            if v is not None and not 0 <= v < 1:
                out.append(error("E0816", f"drop probability must lie in [0, 1), got {v}", op.span,
                                 hint="p is the probability of dropping; 1 would drop everything",
                                 notes=[Note(f"in layer {layer} of {n}")]))
                break
    return out


def check_block(block: Block, base: Mapping[str, float | int], counts: tuple[int, ...],
                declared: Mapping[str, float | int] | None = None) -> list[Diagnostic]:
    """Every attention declaration of ``block``, in each layer whose environment can change its sizes, and the
    linears that project a join, under ``base`` (``declared``: the file's own sizes, when ``base`` overrides them)."""
    out = _joins(block, base, base if declared is None else declared) + _drop_rates(block, base, counts)
    for decl in block.decls:
        if isinstance(decl, KindDecl) and decl.kind in ("embedding", "moe"):
            found = (_padding_row if decl.kind == "embedding" else _moe)(decl, dict(base))
            out += [found] if found is not None else []
        if not isinstance(decl, KindDecl) or decl.kind not in ATTENTION:
            continue
        per_layer = any(uses_layer(decl.arg(n), block) for n in (*COUNTS, "window", "dropout", "rotary_dim")
                        if decl.arg(n) is not None)
        for layer, n, env in contexts(base, block, counts, per_layer):
            found = _attention(block, decl, env)
            if found is not None:
                where = [Note(f"in layer {layer} of {n}")] if per_layer and n > 1 else []
                out.append(error(found.code, found.message, found.span, hint=found.hint, notes=where))
                break
    return out


def check_arguments(program: Program, overrides: Mapping[str, int] | None = None) -> list[Diagnostic]:
    """The argument diagnostics of every block at the declared sizes, with ``overrides`` taking precedence."""
    base = program_env(program, overrides)
    declared = program_env(program) if overrides else base
    counts = layer_counts(program, base)
    return [d for b in program.blocks for d in check_block(b, base, counts.get(b.name, (1,)), declared)]


@verifier("arguments")
def verify_arguments(program: Program) -> list[Diagnostic]:
    return check_arguments(program)

