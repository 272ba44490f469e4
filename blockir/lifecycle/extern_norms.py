"""Measuring a bound extern add+norm against the built-in norm its contract states.

A fused add+norm from Transformer Engine, Apex or Liger returns two tensors of one shape, so a module
that hands them back in the other order, or that takes its statistics in a narrower dtype than the
contract's ``accum``, still has the declared signature. Only running it tells. The module and the
built-in reference (``blockir.lower.layers.add_norm``) get the same parameters — the module's own keys,
each perturbed from its initial value so that a gain that is never applied shows — and the same random
inputs; each result, and the gradient of ``Σ result_i · g_i`` (one random ``g`` per result) with respect
to both inputs and every parameter, is compared with the reference's under a tolerance policy of
``blockir.lifecycle.diverge``: a kernel's backward is written apart from its forward and can be wrong
alone. The inputs are copied before each call: some kernels write the sum over their residual argument.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, Diagnostic, Note, Span, error
from blockir.ir.decls import ExternDecl
from blockir.ir.printer import format_decl
from blockir.lifecycle.diverge import Tolerance
from blockir.lower.layers.add_norm import AddNormReference

ROLES = ("normalized", "residual")


@dataclass(frozen=True)
class ResultCheck:
    """One result of the module against the reference's result of the same role."""

    role: str  # normalized | residual, or the gradient of an input or a parameter: d/dx, d/dresidual, d/dweight
    index: int | None  # a result's position in what the module returns; None for a gradient
    max_error: float  # max |module - reference|; inf for a shape or dtype mismatch or a non-finite value
    bound: float  # atol + rtol * max |reference|
    other_error: float  # max |module - the reference's other result|: small when the two are swapped

    @property
    def passed(self) -> bool:
        return self.max_error <= self.bound


def reference_text(decl: ExternDecl) -> str:
    """The norm the contract states, as the file writes it: ``rmsnorm(D, eps=1e-06, …)``."""
    assert decl.contract is not None
    norm = decl.contract.norm
    given = tuple((k, v) for k, v in norm.args if (spec := norm.spec.arg(k)) is None or spec.positional
                  or v != spec.default)
    return format_decl(replace(norm, args=given)).split(": ", 1)[1]


def _error(ref: torch.Tensor, out: object) -> float:
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape or out.dtype != ref.dtype:
        return float("inf")
    diff = (out.detach().double() - ref.double()).abs()
    return float(diff.max()) if bool(torch.isfinite(diff).all()) else float("inf")


def check_contract(decl: ExternDecl, module: nn.Module, sizes: Sizes, policy: Tolerance, seed: int,
                   dtype: torch.dtype = torch.float32) -> list[ResultCheck]:
    """The module's results and gradients against the built-in's on one seeded random input; the module keeps the
    perturbed parameters it was measured with."""
    contract = decl.contract
    assert contract is not None
    reference = AddNormReference(decl, sizes).to(dtype)
    ours, theirs = reference.state_dict(), module.state_dict()
    if set(ours) != set(theirs) or any(ours[k].shape != theirs[k].shape for k in ours):
        have = ", ".join(f"{k} {list(v.shape)}" for k, v in theirs.items()) or "nothing"
        want = ", ".join(f"{k} {list(v.shape)}" for k, v in ours.items()) or "nothing"
        raise BlockError([error("E0455", f"the module bound to extern '{decl.name}' holds {have}, but "
                                f"{reference_text(decl)} holds {want}", decl.span,
                                hint="bind the module that computes the contract's norm, with the norm's "
                                     "parameters under its keys")])
    gen = torch.Generator().manual_seed(seed)
    state = {k: (v.to(dtype) + 0.25 * torch.randn(v.shape, generator=gen).to(dtype)) if v.is_floating_point() else v
             for k, v in ours.items()}
    reference.load_state_dict(state)
    module.load_state_dict(state)
    shape = [sizes.dim(a.name) for a in decl.params[0].type.axes]
    x, residual = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    upstream = [torch.randn(shape, generator=gen).to(dtype) for _ in range(2)]
    want, want_grads = _run(reference, x, residual, upstream)
    got, got_grads = _run(module, x, residual, upstream, decl)
    out = []
    for index, role in ((contract.normalized, "normalized"), (contract.residual, "residual")):
        ref = want[index]
        out.append(ResultCheck(role, index, _error(ref, got[index]), _bound(policy, ref),
                               _error(want[1 - index], got[index])))
    for name, ref in want_grads.items():
        grad = got_grads.get(name)
        out.append(ResultCheck(f"d/d{name}", None, _error(ref, grad), _bound(policy, ref), float("inf")))
    return out


def _bound(policy: Tolerance, reference: torch.Tensor) -> float:
    return policy.atol + policy.rtol * float(reference.detach().double().abs().max())


def _run(module: nn.Module, x: torch.Tensor, residual: torch.Tensor, upstream: list[torch.Tensor],
         decl: ExternDecl | None = None) -> tuple[list[torch.Tensor], dict[str, torch.Tensor | None]]:
    """The module's two results, and the gradients of ``sum(result_i * upstream_i)`` with respect to both
    inputs and every parameter. The inputs are copies, which an in-place kernel may write over."""
    leaves = {"x": x.clone().requires_grad_(True), "residual": residual.clone().requires_grad_(True)}
    params = dict(module.named_parameters())
    got = module(leaves["x"] * 1, leaves["residual"] * 1)
    if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(isinstance(t, torch.Tensor) for t in got):
        what = f"{len(got)} values" if isinstance(got, (tuple, list)) else f"a {type(got).__name__}"
        raise BlockError([error("E0455", f"the module bound to extern '{decl.name if decl else '?'}' returned "
                                f"{what}, but its contract declares (normalized, residual) in some order: 2 "
                                "tensors", decl.span if decl else Span("", 0, 0))])
    targets = {**leaves, **params}
    total = sum((t * g).sum() for t, g in zip(got, upstream) if t.requires_grad)
    grads = torch.autograd.grad(total, list(targets.values()), allow_unused=True) \
        if isinstance(total, torch.Tensor) and total.requires_grad else [None] * len(targets)
    return [t.detach() for t in got], dict(zip(targets, grads))


def contract_diagnostic(decl: ExternDecl, bound_to: str, checks: list[ResultCheck],
                        policy: Tolerance) -> Diagnostic | None:
    """E0455 at the declaration when a result exceeds the policy, None when every result is within it."""
    failed = [c for c in checks if not c.passed]
    if not failed:
        return None
    results = [c for c in failed if c.index is not None]
    parts = "; ".join((f"result {c.index} ({c.role})" if c.index is not None else f"the gradient {c.role}")
                      + f" differs by max {c.max_error:.3g} > {c.bound:.3g}" for c in failed)
    residual = next(c.index for c in checks if c.role == "residual")
    swapped = len(results) == 2 and all(c.other_error <= c.bound for c in results)
    if swapped:
        hint = (f"the module returns the two results in the other order: its residual is at position "
                f"{1 - residual}; declare residual={1 - residual} or fix the module")
    elif not results:
        hint = "the forward agrees and the backward does not: check the module's gradient"
    elif results[0].role == "normalized":
        hint = f"compute normalized as {reference_text(decl)} does, taking the statistics in the contract's accum dtype"
    else:
        hint = f"return the un-normalized sum x + residual as result {residual}"
    return error("E0455", f"extern '{decl.name}' bound to {bound_to} does not compute its contract "
                 f"({policy.name} policy): {parts}", decl.span,
                 notes=[Note(f"the contract: {reference_text(decl)} of x + residual, residual={residual}",
                             decl.contract.span)] if decl.contract is not None else [],
                 hint=hint)
