"""What a calibration records: the sha256 of the bytes it ran on, and how far the fold it licenses moves the block.

A calibrated checkpoint is only as reproducible as its calibration data, so the record names the exact
windows (a digest of their bytes in the order they were fed), not only the corpus. The fold error is
``max |folded - unfolded|`` of the block's output on those same batches, the folded module built by
``blockir.lower.fold.apply_folds`` from the calibrated one: the fixed-statistics algebra is exact, so
anything above rounding means the fold does not compute what was calibrated. A fold that is refused
(a PRepBN still in its transition, E0751) is recorded with the reason instead of a number.
"""
from __future__ import annotations

import hashlib
from typing import Any

import torch

from blockir.diagnostics import BlockError
from blockir.ir.program import Block, Program
from blockir.lifecycle.calibrate import NormState
from blockir.lifecycle.lm import ByteLM
from blockir.lower.fold import apply_folds


def batches_sha256(batches: list[torch.Tensor]) -> str:
    """The sha256 of the calibration windows' bytes, batch after batch, row after row."""
    digest = hashlib.sha256()
    for b in batches:
        digest.update(b.to(torch.uint8).contiguous().numpy().tobytes())
    return digest.hexdigest()


def fold_error(program: Program, block: Block, model: ByteLM, batches: list[torch.Tensor],
               dims: dict[str, int]) -> tuple[float | None, list[str], str | None]:
    """(max |folded - unfolded| over the batches, the norms folded, None) or (None, [], why the fold is refused)."""
    core = model.core
    training = core.training
    core.eval()
    try:
        result = apply_folds(program, block.name, core, dims=dims)
    except BlockError as exc:
        return None, [], exc.diagnostics[0].message
    finally:
        core.train(training)
    folded = result.module
    assert folded is not None
    folded.eval()
    error = 0.0
    with torch.no_grad():
        for b in batches:
            inputs, _ = model.split(b)
            was = core.training
            core.eval()
            try:
                want, got = core(*inputs), folded(*inputs)
            finally:
                core.train(was)
            error = max(error, float((got.double() - want.double()).abs().max()))
    return error, [e.site.name for e in result.fired if e.site.kind == "statistics"], None


def calibration_record(source: str, batches: list[torch.Tensor], states: list[NormState],
                       fold: tuple[float | None, list[str], str | None]) -> dict[str, Any]:
    """The record ``blockir calibrate --save`` writes beside the checkpoint, and a release attaches."""
    error, folded, refused = fold
    return {"data": source, "batches_sha256": batches_sha256(batches), "batches": len(batches),
            "rows": int(sum(b.shape[0] for b in batches)), "window": int(batches[0].shape[1]) if batches else 0,
            "norms": [{"name": s.name, "calibrated_at": s.calibrated_at, "step": s.step, "transition": s.transition}
                      for s in states],
            "fold": {"max_error": error, "folded": folded, "refused": refused}}
