"""The call boundary of a compiled module: what its forward accepts, checked before it computes anything.

A compiled root checks, in one call at the top of its generated forward (:func:`check_inputs`):

- **arity**: one positional tensor per declared input, no more, none missing;
- **keywords**: every keyword names context that something in the module reads. Each built-in
  module declares what it reads as ``blockir_context`` next to its ``forward`` (a frozenset, or
  ``None`` for "any keyword": a callee that takes ``**kwargs``); a bound extern reads what its
  adapter's signature (or, bound without one, its module's ``forward``) names; a block reads the
  union of what it calls with its context. The root's set is derived once, at compile;
- **inputs**: a tensor of the declared axes and sizes; floating inputs in the module's dtype and on
  its device (both read from one of its own parameters, see :class:`CallContract`), token ids
  integers inside the vocabulary of the embedding that reads them.

A wrong call is a ``BlockError`` located in the ``.block`` file: the block for arity (E0711) and
keywords (E0710), the parameter for an input (E0708) and for a token id (E0712).
"""
from __future__ import annotations

import enum
import inspect
from typing import Any, Callable, Iterable, NamedTuple

import torch

from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, Span, error
from blockir.frontend.scope import suggest
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.program import Block, Program
from blockir.ir.traits import Calls
from blockir.ir.types import DType, Role

Keywords = frozenset[str] | None  # None: any keyword (a callee that takes **kwargs)
NOTHING: frozenset[str] = frozenset()
CONTEXT_ATTR = "blockir_context"
TORCH_DTYPES = {DType.F64: torch.float64, DType.F32: torch.float32, DType.F16: torch.float16,
                DType.BF16: torch.bfloat16}
IDS = "ids"  # the dtype policy of an input an embedding reads: integer token ids



class InputSpec(NamedTuple):
    """One declared input, as the check reads it; a NamedTuple so that fx can print it as a constant."""

    name: str
    axes: tuple[str, ...]
    sizes: tuple[int | None, ...]  # compiled sizes, None where open (batch, sequence, unsized)
    declared: str | None  # the dtype the type states (its .block name), IDS for token ids, or None
    dtype: torch.dtype | None  # ``declared`` as torch names it
    rows: int | None  # rows of the token table the ids index; None: no table reads them by value
    line: int
    column: int


class Missing(enum.Enum):
    """The default of each input of a checked root: told apart from an explicit None (an Enum, so fx prints it)."""

    INPUT = "not given"


FREE_ROLES = (Role.BATCH, Role.SEQ)


def _token_rows(program: Program | None, block: Block, value: str, sizes: Sizes) -> tuple[bool, int | None]:
    """Whether an embedding reads ``value`` (directly, or as an input of a sub-block or stack), and the
    fewest rows of a token table that indexes by it (None when only position tables read its shape)."""
    reads, rows = False, None
    for op in block.users.get(value, ()):
        if not op.has(Calls):
            continue
        decl = block.decl_map[op.decl]
        found: tuple[bool, int | None] = (False, None)
        if isinstance(decl, KindDecl) and decl.kind == "embedding":
            vocab = sizes.env.get(decl.arg("vocab"))
            found = True, None if decl.arg("positions") or vocab is None else int(vocab)
        elif isinstance(decl, InstanceDecl) and program is not None:
            sub = program.block(decl.block)
            for a, p in zip(op.args, sub.params):
                if a == value:
                    inner = _token_rows(program, sub, p.name, sizes)
                    found = (found[0] or inner[0], _fewest(found[1], inner[1]))
        reads, rows = reads or found[0], _fewest(rows, found[1])
    return reads, rows


def _fewest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def input_specs(block: Block, sizes: Sizes, program: Program | None = None) -> tuple[InputSpec, ...]:
    """What the check reads of each input of ``block`` under ``sizes``."""
    specs = []
    for p in block.params:
        # batch and sequence sizes stay free even when dims= gave them (a run compiles at its training
        # batch and evaluates at another); every other size shapes the parameters
        fixed = tuple(None if a.role in FREE_ROLES else int(sizes.env[a.name]) if a.name in sizes.env else
                      (int(sizes.value(a.size)) if a.size is not None else None) for a in p.type.axes)
        ids, rows = _token_rows(program, block, p.name, sizes)
        declared = IDS if ids else p.type.dtype.value if p.type.dtype is not None else None
        dtype = TORCH_DTYPES[p.type.dtype] if declared not in (None, IDS) else None
        specs.append(InputSpec(p.name, tuple(a.name for a in p.type.axes), fixed, declared, dtype, rows,
                               p.span.line, p.span.column))
    return tuple(specs)


def union(parts: Iterable[Keywords]) -> Keywords:
    """The keywords read by several callees together: None as soon as one takes any."""
    out: set[str] = set()
    for part in parts:
        if part is None:
            return None
        out |= part
    return frozenset(out)


def context_of(module: Any) -> Keywords:
    """What ``module`` reads from the context it is called with (``blockir_context``; none if undeclared)."""
    return getattr(module, CONTEXT_ATTR, NOTHING)


def reads(module: Any, key: str) -> bool:
    """Whether ``module`` reads context keyword ``key``: a caller that builds optional context (a causal mask)
    hands it only to modules that read it. A module without a contract may read anything."""
    contract = getattr(module, "blockir_contract", None)
    return contract is None or contract.keywords is None or key in contract.keywords


def signature_keywords(fn: Callable[..., Any], positional: int, named_only: bool = False) -> Keywords:
    """The keywords ``fn`` takes besides its first ``positional`` positional parameters; None with ``**kwargs``
    unless ``named_only`` (its ``**kwargs`` absorbs keywords it does not read).

    A callable without a Python signature takes no keyword that can be known.
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return NOTHING
    if not named_only and any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    ordered = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    taken = {p.name for p in ordered[:positional]}
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                     and p.name not in taken)


class CallContract(NamedTuple):
    """What a compiled root accepts beyond its input specs; a NamedTuple so that fx can print it as a constant.

    ``keywords`` are those the module reads (None: any). ``dtype`` and ``device`` are those of the module's parameters at the activation dtype (None without
    any: a block of parameter-free ops computes in any dtype, on any device); they follow ``.to()``
    (the module refreshes its contract whenever torch converts it, see ``BlockModule._apply``).
    """

    block: str
    filename: str
    line: int
    column: int
    inputs: tuple[str, ...]
    keywords: tuple[str, ...] | None  # sorted; a tuple, since fx prints no frozenset (a few names: as fast)
    dtype: torch.dtype | None = None
    device: torch.device | None = None
    probe: str | None = None  # the parameter dtype and device are read from

    @property
    def span(self) -> Span:
        return Span(self.filename, self.line, self.column)


def accepted(keywords: Keywords) -> tuple[str, ...] | None:
    """The keywords a contract lists: sorted, None for any."""
    return None if keywords is None else tuple(sorted(keywords))


def placed_contract(module: torch.nn.Module, contract: CallContract) -> CallContract:
    """``contract`` with the dtype and device ``module``'s probe parameter has now."""
    if contract.probe is None:
        return contract
    try:
        probe = module.get_parameter(contract.probe)
    except AttributeError:  # replaced by the caller: nothing left to read the place from
        return contract._replace(dtype=None, device=None, probe=None)
    return contract._replace(dtype=probe.dtype, device=probe.device)


def _listed(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))


def keyword_error(contract: CallContract, key: str) -> BlockError:
    accepted = contract.keywords or ()
    if accepted:
        hint = " ".join(filter(None, (suggest(key, accepted), f"{contract.block} reads: {_listed(accepted)}")))
    else:
        hint = f"{contract.block} reads no keyword arguments: nothing in it takes a mask or position table"
    return BlockError([error("E0710", f"{contract.block} takes no keyword argument '{key}': nothing in it reads it",
                             contract.span, hint=hint)])


def _arity(contract: CallContract, inputs: tuple[Any, ...], extra: tuple[Any, ...]) -> None:
    missing = [n for n, t in zip(contract.inputs, inputs) if t is Missing.INPUT]
    if not (extra or missing):
        return
    names = contract.inputs
    takes = f"{contract.block} takes {len(names)} input{'s' if len(names) != 1 else ''} ({', '.join(names)})"
    call = f"call it as m({', '.join(names)}, **context)"
    if extra:
        raise BlockError([error("E0711", f"{takes}, got {len(names) + len(extra)}", contract.span, hint=call)])
    raise BlockError([error("E0711", f"{takes}; {', '.join(map(repr, missing))} not given", contract.span, hint=call)])


def _input_error(filename: str, spec: InputSpec, message: str, hint: str | None = None,
                 code: str = "E0708") -> BlockError:
    span = Span(filename, spec.line, spec.column, spec.column + len(spec.name))
    return BlockError([error(code, message, span, hint=hint)])


def _token_range(contract: CallContract, spec: InputSpec, ids: torch.Tensor) -> None:
    rows = spec.rows
    if rows is None or ids.numel() == 0 or torch.compiler.is_compiling():  # a compiled graph cannot branch on data
        return
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0 or high >= rows:
        bad = low if low < 0 else high
        raise _input_error(contract.filename, spec, f"input '{spec.name}' of {contract.block} holds token id {bad}, "
                                                    f"outside the vocabulary [0, {rows})",
                           hint=f"ids index a table of {rows} rows: check the tokenizer's vocabulary size", code="E0712")


def _narrower(given: torch.dtype, computes: torch.dtype) -> bool:
    """A half-precision stream into a module with f32 weights is mixed precision, which the declared casts
    handle (T5's norm with f32 weights on a bf16 stream); a wider or non-float input is a mistake."""
    return given.is_floating_point and computes.is_floating_point and \
        torch.finfo(given).bits < torch.finfo(computes).bits


def _place(contract: CallContract, spec: InputSpec, t: torch.Tensor) -> None:
    name = spec.name
    if contract.dtype is not None and spec.declared is None and t.dtype is not contract.dtype \
            and not _narrower(t.dtype, contract.dtype):
        raise _input_error(contract.filename, spec, f"input '{name}' of {contract.block} is {t.dtype}, but the "
                                                    f"module computes in {contract.dtype}",
                           hint=f"cast it first: x.to({contract.dtype}), or convert the module: m.to({t.dtype})")
    if contract.device is not None and t.device != contract.device:
        raise _input_error(contract.filename, spec, f"input '{name}' of {contract.block} is on {t.device}, but the "
                                                    f"module's parameters are on {contract.device}",
                           hint=f"move it first: x.to('{contract.device}')")


def check_inputs(contract: CallContract, specs: tuple[InputSpec, ...], ctx: dict[str, Any],
                 extra: tuple[Any, ...], *inputs: Any) -> None:
    """Check one call of a compiled root: arity, keywords, then each input; raise BlockError naming what is wrong.

    Each input must be a floating tensor (of the declared dtype, when the type states one, else of the
    module's), or an integer one when an embedding reads it (token ids, inside its vocabulary), on the
    module's device, with one size per declared axis; an axis with a size at compile time must have
    that size (batch and sequence axes excepted), and an axis named by several inputs must have one
    size across them.
    """
    block, filename, _, _, names, accepted, module_dtype, device, _ = contract
    if extra or len(inputs) != len(names) or any(t is Missing.INPUT for t in inputs):
        _arity(contract, inputs, extra)
    if accepted is not None:
        for key in ctx:
            if key not in accepted:
                raise keyword_error(contract, key)
    seen: dict[str, tuple[int, str]] = {}
    for spec, t in zip(specs, inputs):
        name, axes, sizes, declared = spec[:4]
        if not isinstance(t, torch.Tensor):
            raise _input_error(filename, spec, f"input '{name}' of {block} must be a tensor [{', '.join(axes)}], "
                                               f"got {type(t).__name__}")
        shape, dt = t.shape, t.dtype
        if declared == IDS:
            if dt.is_floating_point or dt.is_complex or dt == torch.bool:
                raise _input_error(filename, spec, f"input '{name}' of {block} holds token ids and must be an "
                                                   f"integer tensor, got {dt}")
        elif not dt.is_floating_point:
            raise _input_error(filename, spec, f"input '{name}' of {block} must be a floating-point tensor, got {dt}")
        elif declared is not None and dt != spec.dtype:
            raise _input_error(filename, spec, f"input '{name}' of {block} is declared {declared}, got {dt}",
                               hint=f"cast it first: x.to({spec.dtype})")
        if declared != IDS and ((module_dtype is not None and declared is None and dt is not module_dtype)
                                or (device is not None and t.device != device)):
            _place(contract, spec, t)
        if len(shape) != len(axes):
            raise _input_error(filename, spec, f"input '{name}' of {block} has {len(shape)} axes {list(shape)}, "
                                               f"expected {len(axes)}: [{', '.join(axes)}]")
        for axis, size, actual in zip(axes, sizes, shape):
            if size is not None and actual != size:
                raise _input_error(filename, spec, f"input '{name}' of {block}: axis {axis} has size {actual}, "
                                                   f"but the module was compiled with {axis} = {size}",
                                   hint=f"compile with dims={{'{axis}': {actual}}} for this size")
            first = seen.setdefault(axis, (actual, name))
            if first[0] != actual:
                raise _input_error(filename, spec, f"input '{name}' of {block}: axis {axis} has size {actual}, "
                                                   f"but input '{first[1]}' has {axis} = {first[0]}")
        if declared == IDS:
            _token_range(contract, spec, t)
