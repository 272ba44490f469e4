"""The conformance checks a release runs on the checkpoint it freezes, each recorded with what it measured.

A release's evidence is the list of checks, not a claim: each names what it compared, the tolerance
it was held to, the error it measured and whether it passed, so a reader of ``release.yaml`` can tell
a check that was run from one that was not (which is listed too, with the reason).

- ``verifiers``: the graph's error count (tolerance 0).
- ``forward``: non-finite logits of the eager fp32 model on two seeded random windows (tolerance 0).
- ``fused``: the model compiled with the fused backend against the eager fx one on those windows,
  ``max |fused - fx|`` of the logits under the fp32 policy of ``blockir diverge``.
- ``bf16``: the eager model under bf16 autocast against fp32, under the bf16 policy.
- ``distributed``: listed as not run: the released runtime is one device, and a tensor-parallel
  check needs a process group the release does not start.

The bound of a policy is ``atol + rtol * max |reference|``, as ``blockir diverge`` takes it. A release
is refused when its graph has errors, its forward is not finite, or the check of its own runtime
backend fails; the other checks are recorded as measured.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from blockir.diagnostics import BlockError
from blockir.ir.program import Block, Program
from blockir.lifecycle.diverge import POLICIES, Tolerance
from blockir.lifecycle.lm import ByteLM
from blockir.lifecycle.placement import autocast
from blockir.lifecycle.session import RunConfig, build_model


def _check(name: str, what: str, tolerance: float | None, error: float | None, passed: bool | None,
           ran: bool = True, reason: str | None = None) -> dict[str, Any]:
    """One check's record; one that did not run has neither a measured error nor a verdict."""
    out = {"check": name, "what": what, "ran": ran, "tolerance": tolerance, "measured_error": error,
           "passed": passed if ran else None}
    return out | ({"reason": reason} if reason is not None else {})


def _bound(policy: Tolerance, reference: torch.Tensor) -> float:
    return policy.atol + policy.rtol * float(reference.detach().double().abs().max())


def _logits(model: ByteLM, window: torch.Tensor, dtype: str = "fp32") -> torch.Tensor:
    with torch.no_grad(), autocast(dtype, window.device):
        logits, _ = model.eval().logits(window)
    return logits.float()


def _compared(name: str, what: str, policy: Tolerance, reference: torch.Tensor,
              candidate: torch.Tensor) -> dict[str, Any]:
    bound = _bound(policy, reference)
    same = candidate.shape == reference.shape and bool(torch.isfinite(candidate).all())
    error = float((candidate.double() - reference.double()).abs().max()) if same else float("inf")
    return _check(name, what + f" ({policy.name} policy: atol {policy.atol:g} + rtol {policy.rtol:g} * "
                  "max |reference|)", bound, error, error <= bound)


def conformance_checks(program: Program, block: Block, cfg: RunConfig, load: Any,
                       errors: int) -> list[dict[str, Any]]:
    """Every check, in order; ``load(model)`` puts the checkpoint's parameters into a freshly built model."""
    checks = [_check("verifiers", "errors the verifiers report on the checkpoint's graph", 0, float(errors),
                     errors == 0)]
    eager = load(build_model(program, block, replace(cfg, backend="fx"))[0])
    window = torch.randint(0, 256, (2, eager.shape.window), generator=torch.Generator().manual_seed(cfg.seed))
    reference = _logits(eager, window)
    bad = int((~torch.isfinite(reference)).sum())
    checks.append(_check("forward", f"non-finite logits of {reference.numel()} on 2 random windows (eager fp32)",
                         0, float(bad), bad == 0))
    try:
        fused = load(build_model(program, block, replace(cfg, backend="fused"))[0])
    except BlockError as exc:
        checks.append(_check("fused", "fused backend against eager fx", POLICIES["fp32"].atol, None, False, False,
                             exc.diagnostics[0].message))
    else:
        checks.append(_compared("fused", "max |fused - fx| of the logits", POLICIES["fp32"], reference,
                                _logits(fused, window)))
    checks.append(_compared("bf16", "max |bf16 autocast - fp32| of the logits", POLICIES["bf16"], reference,
                            _logits(eager, window, "bf16")))
    checks.append(_check("distributed", "tensor-parallel ranks against one device", None, None, False, False,
                         "not run: the released runtime is one device (replicated); a tensor-parallel check needs a "
                         "process group"))
    return checks


def blocking(checks: list[dict[str, Any]], backend: str) -> dict[str, Any] | None:
    """The first failed check that refuses the release: the graph, the forward, or the runtime backend's own."""
    own = {"verifiers", "forward"} | ({"fused"} if backend == "fused" else set())
    return next((c for c in checks if c["check"] in own and c["ran"] and not c["passed"]), None)
