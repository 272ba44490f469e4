"""The installed transformers release, for the families whose HF code changed its arithmetic between releases:
exact mode writes the order of operations of the code it will be compared with.

Read from the package's metadata, without importing transformers. With none installed the newest code's
behaviour is written, which is what installing transformers today gives.
"""
from __future__ import annotations

import re
from functools import cache
from importlib import metadata


@cache
def _installed() -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in re.findall(r"\d+", metadata.version("transformers"))[:3])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def transformers_at_least(*release: int) -> bool:
    """True when the installed transformers is ``release`` or later, or when none is installed."""
    installed = _installed()
    return installed is None or installed[:len(release)] >= release
