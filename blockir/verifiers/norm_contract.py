"""The norm contract: what each norm reduces over, its epsilon, family and precision.

A Transformer norm computes one statistic per row over the model axis
(Ba et al., 2016; Zhang and Sennrich, 2019); reducing over S, B or the whole sentence is a different
method. eps must be positive in every layer it is evaluated for. A LayerNorm
without centering is an RMSNorm; an RMSNorm with a bias is not one. Half
precision rows need f32 statistics. One norm instance applied at two sites
ties their learned scale, which the checkpoint must say (``tied=true``).
"""
from __future__ import annotations


from blockir.norms import family
from blockir.analyses.sizes import contexts, layer_counts, program_env, uses_layer, value
from blockir.analyses.structure import describe
from blockir.analyses.summaries import summaries
from blockir.diagnostics import Diagnostic, Note, error, warning
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.traits import Normalizes
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.ir.types import DType, Role, TensorType
from blockir.verifiers.registry import verifier

ROW_WORDS = {Role.SEQ: "the tokens of each sequence", Role.BATCH: "the examples of each batch"}
ROLE_WORDS = {Role.SEQ: "sequence", Role.BATCH: "batch"}


def _sites(block: Block, name: str) -> list[tuple[Op, str, TensorType]]:
    """(op, input value, input type) for every application of norm ``name``."""
    return [(op, v, block.type_of(v)) for op in block.ops
            if op.has(Normalizes) and op.decl == name and (v := op.norm_input()) is not None]


def _check_axes(program: Program, decl: KindDecl, sites: list[tuple[Op, str, TensorType]],
                block: Block) -> list[Diagnostic]:
    axes: tuple[str, ...] = decl.arg("axes")
    roles = {a: program.dim_map[a].role for a in axes if a in program.dim_map}
    rows = [a for a in axes if roles.get(a) in ROW_WORDS]
    fix = f"reduce over the model axis of each row: {decl.kind}({_model_axis(program)})"
    if rows and len(axes) == 1:
        role = roles[rows[0]]
        return [error("E0301", f"{decl.kind} '{decl.name}' reduces over {rows[0]}, a {ROLE_WORDS[role]} axis: "
                      f"its statistics would mix {ROW_WORDS[role]}", decl.span, hint=fix)]
    if rows:
        shapes = ""
        if sites:
            t = sites[0][2]
            stats = "[" + ", ".join("1" if a in axes else a for a in t.names) + "]"
            shapes = f": its statistics are {stats}, not one per row [{', '.join([*t.names[:-1], '1'])}]"
        return [error("E0302", f"{decl.kind} '{decl.name}' reduces over [{', '.join(axes)}] as one sample{shapes}",
                      decl.span, hint=fix)]
    out = []
    for op, operand, t in sites:
        if t.names[-len(axes):] != axes:
            out.append(error("E0303", f"{decl.kind} '{decl.name}' reduces over [{', '.join(axes)}], but its input "
                             f"{describe(block, operand)} is {t}", op.span, notes=[Note("declared here", decl.span)],
                             hint="a norm reduces over the trailing axes of its input; declare it with that axis"))
    return out


def _model_axis(program: Program) -> str:
    return next((d.name for d in program.dims if d.role == Role.MODEL), "D")


def _check_eps(decl: KindDecl, block: Block, base: dict, counts: tuple[int, ...]) -> Diagnostic | None:
    eps = decl.arg("eps")
    if eps is None:
        return None
    per_layer = uses_layer(eps, block)
    for layer, n, env in contexts(base, block, counts, per_layer):
        v = value(eps, env)
        if v is not None and v <= 0:
            where = f" in layer {layer} of {n}" if per_layer else ""
            return error("E0304", f"eps of {decl.kind} '{decl.name}' is {v}{where}; it must be > 0", decl.span,
                         hint="eps sits inside the square root and keeps it away from zero in every layer")
    return None


def _check_family(decl: KindDecl) -> Diagnostic | None:
    return family(decl).contract(decl)


def _check_precision(decl: KindDecl, sites: list[tuple[Op, str, TensorType]], block: Block) -> list[Diagnostic]:
    accum = decl.arg("accum")
    if accum is None or not DType(accum).is_half:
        return []
    return [warning("W0301", f"{decl.kind} '{decl.name}' accumulates the row statistics of {describe(block, v)} "
                    f"({t.dtype.value}) in {accum}", op.span, notes=[Note("declared here", decl.span)],
                    hint="use accum=f32: half-precision moments lose small deviations (LLaMA's RMSNorm computes "
                         "the mean square in f32 before casting back)")
            for op, v, t in sites if t.dtype is not None and t.dtype.is_half]


def _check_sharing(decl: KindDecl, sites: list[tuple[Op, str, TensorType]], block: Block) -> Diagnostic | None:
    if decl.arg("tied") or not family(decl).keys(decl, (1,)):
        return None  # tied on purpose, or nothing learned to share (l2norm)
    first: dict[str, Op] = {}
    for op, operand, _ in sites:
        first.setdefault(operand, op)
    if len(first) < 2:
        return None  # the same value normalized twice is a recomputation, not a shared instance
    (a, op_a), (b, op_b) = list(first.items())[:2]
    return error("E0307", f"{decl.kind} '{decl.name}' is applied to {describe(block, a)} and to {describe(block, b)}: "
                 "one instance at two sites ties their learned scale", op_b.span,
                 notes=[Note("first applied here", op_a.span)],
                 hint="declare one norm per site, or tied=true if the checkpoint really shares it")


def _check_consistent_eps(program: Program, block: Block) -> list[Diagnostic]:
    """One eps per norm family across a block and what it stacks, as a config's single eps gives."""
    own = {d.name for d in block.decls}
    out = []
    for family, entries in summaries(program)[block.name].eps.items():
        common = max(entries, key=lambda e: e.count)  # the first seen wins a tie
        for e in entries:
            if e.value != common.value and e.owner == block.name and e.decl.name in own:
                out.append(warning("W0302", f"eps of {family} '{e.decl.name}' is {e.value:g}, but {family} "
                                   f"'{common.decl.name}' uses {common.value:g}", e.decl.span,
                                   notes=[Note("the other eps", common.decl.span)],
                                   hint="a checkpoint's config gives one eps per norm family; a different value "
                                        "keeps every shape and changes every normalized row"))
    return out


def _check_shared_instances(program: Program, block: Block) -> list[Diagnostic]:
    """A block instance that applies an untied norm, called on two values, shares that norm (E0307's rule)."""
    facts = summaries(program)
    calls: dict[str, dict[tuple[str, ...], Op]] = {}  # instance → first call per distinct argument list
    for op in block.ops:
        calls.setdefault(getattr(op, "decl", None) or "", {}).setdefault(op.operands, op)
    out = []
    for d in block.decls:
        if not isinstance(d, InstanceDecl) or d.count is not None or d.block not in facts:
            continue
        norm = facts[d.block].untied_norm
        first = calls.get(d.name, {})
        if norm is None or len(first) < 2:
            continue
        (a, op_a), (b, op_b) = list(first.items())[:2]
        out.append(error("E0307", f"block instance '{d.name}' ({d.block}) is applied to {describe(block, a[0])} and to "
                         f"{describe(block, b[0])}: its norm '{norm.path}' is one instance at two sites, which ties "
                         "their learned scale", op_b.span,
                         notes=[Note("first applied here", op_a.span), Note("the norm", norm.span)],
                         hint="declare one instance per site, or tied=true on the norm if the checkpoint really "
                              "shares it"))
    return out


def verify_block(program: Program, block: Block, base: dict, counts: tuple[int, ...]) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for declared in block.decls:
        # an extern add+norm is held to the norm its contract states, applied where the extern is called
        contract = getattr(declared, "contract", None)
        decl = contract.norm if contract is not None else declared
        if not isinstance(decl, KindDecl) or decl.category != "norm":
            continue
        sites = _sites(block, decl.name)
        out += _check_axes(program, decl, sites, block)
        out += _check_precision(decl, sites, block)
        out += [d for d in (_check_eps(decl, block, base, counts), _check_family(decl),
                            _check_sharing(decl, sites, block)) if d is not None]
    return out


@verifier("norm-contract")
def verify_norm_contract(program: Program) -> list[Diagnostic]:
    base = program_env(program)
    counts = layer_counts(program, base)
    return [d for b in program.blocks for d in (verify_block(program, b, base, counts.get(b.name, (1,)))
                                                + _check_consistent_eps(program, b)
                                                + _check_shared_instances(program, b))]
