"""Pausing Python's cyclic garbage collector around work that allocates much and frees nothing in cycles."""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run without the cyclic garbage collector. Importing the pipeline, parsing and typing allocate many
    small objects and free none of them in cycles, so the collector would only rescan them again and again
    (half of the time on large files, a tenth of a start). Its previous state is restored; reference
    counting still frees memory."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():  # a process that froze objects (before a fork) keeps them frozen
                # what was allocated meanwhile joins the oldest generation unscanned (freeze, then unfreeze,
                # moves every tracked object there): the next young collection would otherwise traverse it all
                gc.freeze()
                gc.unfreeze()
            gc.enable()
