"""Distributed lowering: a compiled module parallelised on PyTorch's own engine.

The plan comes from :mod:`blockir.analyses.parallel`; this package turns it
into ``torch.distributed.tensor.parallel`` styles over a ``DeviceMesh`` and
applies them with ``parallelize_module``.
"""
from __future__ import annotations

from blockir.lower.distributed.tp import parallelize

__all__ = ["parallelize"]
