"""Lift: recover the block topology of existing PyTorch code, check it, and certify it equal.

``blockir.lift(module, *example_args, **example_kwargs)`` is :func:`blockir.lift.api.lift`. The
package itself is callable, so the name means the same whether ``blockir.lift`` was reached as
the function (the lazy export of :mod:`blockir`) or imported as this package.
"""
from __future__ import annotations

import sys
import types
from typing import Any

from blockir.lift.api import LiftResult, lift

__all__ = ["LiftResult", "lift"]


class _Callable(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> LiftResult:
        return lift(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable
