"""Per-object caching for analyses of immutable IR.

IR objects compare by value with spans left out, so two equal blocks from
different files would share one entry in an ordinary cache and report each
other's spans. Analyses are therefore cached by object identity, and an
entry lives exactly as long as the object it describes.
"""
from __future__ import annotations

import weakref
from functools import wraps
from typing import Callable, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def per_object(compute: Callable[[K], V]) -> Callable[[K], V]:
    """``compute(obj)``, evaluated once per live object."""
    cache: dict[int, tuple[weakref.ref, V]] = {}

    @wraps(compute)
    def cached(obj: K) -> V:
        key = id(obj)
        hit = cache.get(key)
        if hit is not None and hit[0]() is obj:
            return hit[1]
        value = compute(obj)
        cache[key] = (weakref.ref(obj, lambda _, key=key: cache.pop(key, None)), value)
        return value

    return cached
