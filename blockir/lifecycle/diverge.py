"""The first divergent value: compare two traces in execution order under a declared tolerance policy.

A final output that agrees can hide intermediate values that do not (errors cancel at a norm);
an output that disagrees says nothing about where. Walking every IR value in execution order
and stopping at the first one whose error exceeds the policy names the operator to look at.

A policy is declared, never ``allclose`` by habit: a value diverges when
``max|candidate - reference| > atol + rtol * max|reference|``, or when the candidate is
non-finite where the reference is finite, or when the shapes differ.

- ``fp32``: an fp32 oracle, both sides fp32 computing the same function: atol = rtol = 1e-5.
- ``bf16``: a bf16 candidate against an fp32 reference: rtol = 2**-6 (two units of bf16's
  8-bit mantissa) and atol = 1e-2 for values near zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from blockir.ir.decls import InstanceDecl
from blockir.ir.printer import format_op
from blockir.ir.program import Block, Program


@dataclass(frozen=True)
class Tolerance:
    name: str
    atol: float
    rtol: float


POLICIES = {"fp32": Tolerance("fp32", 1e-5, 1e-5), "bf16": Tolerance("bf16", 1e-2, 2.0 ** -6)}


@dataclass(frozen=True)
class Divergence:
    value: str  # the IR value's path, as blockir.trace names it
    max_error: float  # max |candidate - reference|; inf for a shape mismatch or a non-finite candidate
    bound: float  # what the policy allowed for this value
    reason: str
    agreed: int  # values compared before it, all within the policy


def _error(ref: torch.Tensor, cand: torch.Tensor, policy: Tolerance) -> tuple[float, float, str] | None:
    if ref.shape != cand.shape:
        return float("inf"), 0.0, f"shape {list(cand.shape)} instead of {list(ref.shape)}"
    r, c = ref.detach().double(), cand.detach().double()
    finite = torch.isfinite(r)
    if bool((finite & ~torch.isfinite(c)).any()):
        return float("inf"), 0.0, "non-finite where the reference is finite"
    err = float((r - c)[finite].abs().max()) if bool(finite.any()) else 0.0
    bound = policy.atol + policy.rtol * (float(r[finite].abs().max()) if bool(finite.any()) else 0.0)
    return (err, bound, "error above the policy's bound") if err > bound else None


def first_divergence(reference: Mapping[str, torch.Tensor], candidate: Mapping[str, torch.Tensor],
                     policy: Tolerance) -> tuple[Divergence | None, int]:
    """The first value of ``reference`` (in its order: execution order for a trace) that ``candidate`` misses.

    Values only one side has (a fused op's internals) are skipped. Returns (divergence or None,
    number of values compared).
    """
    compared = 0
    for name, ref in reference.items():
        cand = candidate.get(name)
        if not isinstance(ref, torch.Tensor) or not isinstance(cand, torch.Tensor):
            continue
        found = _error(ref, cand, policy)
        if found is not None:
            return Divergence(name, *found, agreed=compared), compared + 1
        compared += 1
    return None, compared


def producer(program: Program, block: Block, path: str) -> str | None:
    """The op that computes value ``path`` (``layers.1.%5``), printed as the IR prints it."""
    *scopes, leaf = path.split(".")
    for part in scopes:
        if part.isdigit():
            continue  # a stack index: every layer runs the same block
        decl = block.decl_map.get(part)
        if not isinstance(decl, InstanceDecl):
            return None
        block = program.block(decl.block)
    op = block.producers.get(leaf)
    return format_op(op).strip() if op is not None else None
