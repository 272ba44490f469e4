"""blockir.compile: a verified program → a torch module."""
from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Mapping

import torch

from blockir.api import load, verify
from blockir.lower.bind import check_bind
from blockir.lower.fx.builder import FX
from blockir.lower.fx.module import BlockModule
from blockir.lower.fx.tree import lower_block
from blockir.lower.layers.modules import tie_heads
from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, Span, argument_error, error
from blockir.ir.program import Program
from blockir.signatures import public

BACKENDS = ("fx", "fused")
MODES = ("train", "infer")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SEEDS = range(-(1 << 63), 1 << 64)  # what torch.manual_seed accepts


def _bad(argument: str, message: str, hint: str | None = None) -> BlockError:
    return BlockError([argument_error("compile", argument, message, hint)])


def checked_device(device: torch.device | str | None) -> torch.device | None:
    """The device as torch names it, refused here when torch could not allocate on it."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise _bad("device", f"device must be a str or torch.device, got {type(device).__name__}", "device='cpu'")
    try:
        place = torch.device(device)
        torch.empty(0, device=place)
    except (RuntimeError, AssertionError) as exc:  # an unparsable name, or a backend this build lacks
        raise _bad("device", f"cannot allocate on device {str(device)!r}", f"torch says: {str(exc).splitlines()[0]}") from None
    return place


def _capacity(place: torch.device | None) -> tuple[int, str]:
    """The memory of the device parameters are built on, in bytes, and its name."""
    place = place or torch.get_default_device()
    if place.type == "meta":  # shapes only: nothing is allocated
        return 1 << 62, str(place)
    if place.type == "cuda":
        return torch.cuda.get_device_properties(place).total_memory, str(place)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine"
    except (AttributeError, ValueError, OSError):  # no sysconf: nothing to compare with
        return 1 << 62, str(place)


def _check_arguments(name: Any, backend: Any, dtype: Any, seed: Any, mode: Any) -> None:
    if not isinstance(name, str):
        raise _bad("name", f"the block name must be a str, got {type(name).__name__}")
    if mode not in MODES:
        raise _bad("mode", f"mode must be 'train' or 'infer', got {mode!r}")
    if backend not in BACKENDS:
        raise _bad("backend", f"unknown backend {backend!r}; expected one of {', '.join(map(repr, BACKENDS))}")
    if dtype is not None and dtype not in DTYPES:
        raise _bad("dtype", f"dtype must be a floating torch.dtype, got {dtype!r}",
                   "one of torch.float16, torch.bfloat16, torch.float32, torch.float64")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed not in SEEDS):
        raise _bad("seed", f"seed must be an int in [-2**63, 2**64), got {seed!r}")


@public("compile")
def compile(program: Program | str | Path, name: str, backend: str = "fx", *, dims: Mapping[str, int] | None = None,
            bind: Mapping[str, Any] | None = None, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None, seed: int | None = None,
            mode: str = "train") -> BlockModule:
    """Compile block or model ``name`` to a GraphModule whose state_dict keys are the declared names.

    The module's forward checks its inputs against the block's declared axes (a floating
    tensor per input, one size per axis, sizes fixed at compile time kept, one size per axis
    name across inputs) and raises ``BlockError`` (E0708) naming the input and the axis.

    ``bind`` maps extern declaration paths (``"self_attn"``, ``"layers.3.attn"``) to a module or
    ``(module, adapter)``: every key must name an extern and every extern must be bound; the caller's
    modules are never modified (their parameters are shared, or copied when ``dtype`` converts them);
    ``dtype`` is the parameter dtype of every declaration whose input the
    IR leaves at the activation dtype (and of bound modules); ``seed`` makes parameter initialisation deterministic without touching
    the global generator; ``backend="fused"`` replaces legal add+norm chains with fused custom ops.
    ``mode="infer"`` writes the residual adds that the inference liveness plan allows over their
    shortcut's buffer when run without autograd (``torch.no_grad``/``inference_mode``); the
    caller's input tensors are never overwritten.
    """
    _check_arguments(name, backend, dtype, seed, mode)
    place = checked_device(device)
    if isinstance(program, (str, Path)):
        program = load(program)
    elif not isinstance(program, Program):
        raise _bad("program", f"expected a Program or a path, got {type(program).__name__}",
                   "blockir.compile('model.block', ...) or blockir.compile(blockir.parse(text), ...)")
    else:
        errors = [d for d in verify(program) if d.is_error]
        if errors:
            raise BlockError(errors)
    if name not in program.block_map:
        raise BlockError([error("E0700", f"no block named '{name}' (blocks: {', '.join(program.block_map)})",
                                Span(program.filename, 1, 1))])
    sizes = Sizes.of(program, dims)
    from blockir.reports.budget import budget_diagnostics, parameter_diagnostics
    from blockir.verifiers.arguments import check_arguments  # sizes given here can break what check accepted
    wrong = [d for d in check_arguments(program, dims) if d.is_error] or budget_diagnostics(program, name, dims) \
        or parameter_diagnostics(program, name, dims, (dtype or torch.get_default_dtype()).itemsize,
                                 *_capacity(place))  # before anything is built
    if wrong:
        raise BlockError(wrong)
    bindings = check_bind(program, program.block(name), sizes, bind, dtype)
    lowering = FX
    if backend == "fused":
        from blockir.lower.fused.lowering import FUSED
        from blockir.passes.fuse import FUSE
        from blockir.passes.inline import inline_pass
        from blockir.passes.manager import run_passes
        program = run_passes(program, [inline_pass(name, sizes), FUSE])
        lowering = FUSED
    rng = torch.random.fork_rng() if seed is not None else nullcontext()
    with rng, place if place is not None else nullcontext():
        if seed is not None:
            torch.manual_seed(seed)
        module = lower_block(program, program.block(name), sizes, bindings, act_dtype=dtype, mode=mode, check=True,
                             backend=lowering)
    tie_heads(module, program.block(name))
    return module
