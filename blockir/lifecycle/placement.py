"""Where and how a run computes: its device, bf16 autocast over fp32 master weights, torch.compile.

``--dtype bf16`` keeps the parameters, gradients and AdamW moments in fp32 and runs the forward
and backward under ``torch.autocast(dtype=torch.bfloat16)``: matrix products in bf16, reductions
and the loss in fp32, the update applied to fp32 weights (the usual mixed-precision recipe, which
needs no loss scaling for bf16). ``fp32`` runs without autocast.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
from torch import nn

from blockir.diagnostics import BlockError, Span, error


def run_device(name: str | None, where: str = "RunConfig(device=…)") -> torch.device:
    """The device a run trains on; one torch cannot allocate on is refused (E0845) at ``where``."""
    if name is None:
        return torch.device("cpu")
    try:
        place = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise BlockError([error("E0845", f"{name!r} is not a device name torch knows: {str(exc).splitlines()[0]}",
                                Span(where, 0, 0), hint="cpu, cuda, cuda:1, mps, …")]) from None
    try:
        torch.empty(0, device=place)
    except (RuntimeError, AssertionError) as exc:  # a backend this build lacks, or no such device index
        raise BlockError([error("E0845", f"cannot train on device {name!r}: {str(exc).splitlines()[0]}",
                                Span(where, 0, 0), hint="leave the device out to train on the CPU, or name "
                                "one this machine has (torch.cuda.device_count() says how many GPUs)")]) from None
    return place


def autocast(dtype: str, place: torch.device) -> ContextManager[object]:
    """bf16 autocast on the run's device, or nothing for fp32."""
    if dtype == "bf16":
        return torch.autocast(device_type=place.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def compile_forward(model: nn.Module, backend: str | None, where: str = "RunConfig(compile=…)") -> None:
    """``torch.compile`` the model's forward in place (its state_dict keys stay as they are)."""
    if backend is None:
        return
    from torch._dynamo import list_backends
    known = list_backends(exclude_tags=())
    if backend not in known:
        raise BlockError([error("E0846", f"torch.compile has no backend {backend!r}", Span(where, 0, 0),
                                hint="inductor (the default), aot_eager or eager; torch._dynamo.list_backends() "
                                     "lists the rest")])
    model.compile(backend=backend)
