"""What a compiled module would allocate, checked before anything is allocated.

Compiling builds one module per layer of every stack, and training keeps the
inputs of the wrapper ops for backward. Both are known from the program and
the sizes without building anything (the residual-update ledger counts them
in time independent of the depth), so a request that could never run is
refused with a diagnostic instead of exhausting memory or time:

- at most ``MAX_LAYERS_COMPILED`` block instances (layers, counted through
  nested stacks): each is its own module, built in milliseconds;
- at most ``MAX_SAVED_BYTES`` saved for backward by the residual wrapper
  alone (adds, scales, dropouts, casts, norms, in f32); branch internals come
  on top, so this is a lower bound of the activation memory;
- parameters that fit the memory of the device they are built on (their count
  comes from the parameter keys, which need no module either).
"""
from __future__ import annotations

from typing import Mapping

from blockir.reports.cost import CostError, instances, ledger
from blockir.reports.model_size import model_size
from blockir.diagnostics import BlockError, Diagnostic, Span, error
from blockir.ir.decls import InstanceDecl
from blockir.ir.program import Program
from blockir.ir.types import DType

MAX_LAYERS_COMPILED = 4096
MAX_SAVED_BYTES = 16 << 30


def budget_diagnostics(program: Program, name: str, dims: Mapping[str, int] | None = None) -> list[Diagnostic]:
    """E0706 for a module too large to build or train at these sizes; nothing when a size is missing
    (the compiler reports that itself)."""
    try:
        counts = instances(program, name, dims)
    except CostError:
        return []
    root = program.block(name)
    stacks = [d for d in root.decls if isinstance(d, InstanceDecl) and d.count is not None]
    span = stacks[0].span if stacks else root.span if root.span.filename != "<unknown>" else Span(program.filename, 1, 1)
    layers = sum(n for block, n in counts.items() if block != name)
    if layers > MAX_LAYERS_COMPILED:  # checked before the ledger, whose key table walks every layer
        return [error("E0706", f"compiling '{name}' would build {layers:,} layer modules; the limit is "
                      f"{MAX_LAYERS_COMPILED:,}", span,
                      hint="analyses (check, cost, keys) work at any depth; compile a shallower stack to run it")]
    try:
        saved = ledger(program, name, dims, DType.F32).total.unfused.saved_bytes
    except CostError:  # a size the walk did not need is missing: the compiler reports it itself
        return []
    if saved > MAX_SAVED_BYTES:
        return [error("E0706", f"training '{name}' at these sizes would keep at least {saved / (1 << 30):,.1f} GiB "
                      f"for backward; the limit is {MAX_SAVED_BYTES >> 30} GiB", span,
                      hint="give smaller batch and sequence sizes")]
    return []


def parameter_diagnostics(program: Program, name: str, dims: Mapping[str, int] | None, itemsize: int,
                          capacity: int, device: str) -> list[Diagnostic]:
    """E0706 when the parameters of ``name`` alone, at ``itemsize`` bytes each, exceed ``capacity`` bytes."""
    try:
        count = model_size(program, name, dims or {}).parameters
    except BlockError:  # a missing size: the compiler reports it itself
        return []
    need = count * itemsize
    if need <= capacity:
        return []
    root = program.block(name)
    span = root.span if root.span.filename != "<unknown>" else Span(program.filename, 1, 1)
    return [error("E0706", f"compiling '{name}' would allocate {need / (1 << 30):,.1f} GiB of parameters "
                  f"({count:,} of {itemsize} bytes), more than the {capacity / (1 << 30):,.1f} GiB of memory "
                  f"of {device}", span, hint="give smaller sizes in dims=, or a smaller dtype")]
