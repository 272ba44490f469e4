"""Lift: recover the block topology of existing PyTorch code, check it, and certify it equal."""
from __future__ import annotations

from blockir.lift.api import LiftResult, lift

__all__ = ["LiftResult", "lift"]
