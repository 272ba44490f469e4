"""blockir.compile: a verified program → a torch module."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, Mapping

import torch

from blockir.api import load, verify
from blockir.backends.fx import BlockModule, lower_block
from blockir.backends.sizes import program_sizes
from blockir.diagnostics import BlockError, Span, error
from blockir.ir.program import Program

BACKENDS = ("fx", "fused")


def compile(program: Program | str | Path, name: str, backend: str = "fx", *, dims: Mapping[str, int] | None = None,
            bind: Mapping[str, Any] | None = None, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None, seed: int | None = None,
            mode: str = "train") -> BlockModule:
    """Compile block or model ``name`` to a GraphModule whose state_dict keys are the declared names.

    The module's forward checks its inputs against the block's declared axes (a floating
    tensor per input, one size per axis, sizes fixed at compile time kept, one size per axis
    name across inputs) and raises ``BlockError`` (E0706) naming the input and the axis.

    ``bind`` maps extern declaration paths (``"self_attn"``, ``"layers.3.attn"``) to a module or
    ``(module, adapter)``; ``dtype`` is the parameter dtype of every declaration whose input the
    IR leaves at the activation dtype (and of bound modules); ``seed`` makes parameter initialisation deterministic without touching
    the global generator; ``backend="fused"`` replaces legal add+norm chains with fused custom ops.
    ``mode="infer"`` writes the residual adds that the inference liveness plan allows over their
    shortcut's buffer when run without autograd (``torch.no_grad``/``inference_mode``); the
    caller's input tensors are never overwritten.
    """
    if mode not in ("train", "infer"):
        raise ValueError(f"mode must be 'train' or 'infer', got {mode!r}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if not isinstance(program, Program):
        program = load(program)
    else:
        errors = [d for d in verify(program) if d.is_error]
        if errors:
            raise BlockError(errors)
    if name not in program.block_map:
        raise BlockError([error("E0700", f"no block named '{name}' (blocks: {', '.join(program.block_map)})",
                                Span(program.filename, 1, 1))])
    if backend == "fused":
        import blockir.backends.fused.lowering  # noqa: F401  (registers the fused op lowering)
        from blockir.rewrites.fuse import fuse_program
        from blockir.rewrites.inline import inline_stacks
        program, _ = fuse_program(inline_stacks(program, name))
    sizes = program_sizes(program, dims)
    rng = torch.random.fork_rng() if seed is not None else nullcontext()
    place = torch.device(device) if device is not None else nullcontext()
    with rng, place:
        if seed is not None:
            torch.manual_seed(seed)
        module = lower_block(program, program.block(name), sizes, dict(bind or {}), act_dtype=dtype, mode=mode,
                             check=True)
    return module
