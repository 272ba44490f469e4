"""Which rows of the sequence an attention call holds, and where it finds the keys of the others.

A self-attention asks its ``query_rows`` at six seams: its projections as tensors of its own rows
(``local``), the keys and values of the whole sequence (``keys``), the positions of its rows among the
call's (``positions``), how many queries it holds and the
position of the first (``span``, for the masks), where its queries lie among all (``queries``, for the
dropout keyed by the global query) and its output in the stream's form (``stream``). On one
process it holds every row and each seam is the identity (``WHOLE``); context parallelism
(``blockir.lower.distributed.context``) gives each rank a slice of the rows and gathers the keys.
"""
from __future__ import annotations

from typing import Any

from torch import Tensor


class QueryRows:
    """Every row at hand: the projections are the rows, their keys are all the keys."""

    def local(self, t: Tensor) -> Tensor:
        return t

    def keys(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return k, v

    def positions(self, ids: Tensor | None) -> Tensor | None:
        """The positions ``[B or 1, held]`` of the rows held, from the call's ``position_ids`` (None: the
        rows' own order)."""
        return ids

    def span(self, seq: Any) -> tuple[Any, int | Tensor | None]:
        """(queries held, position of the first among the keys, or of each: a tensor); None: the queries are
        the last keys."""
        return seq, None

    def queries(self, held: int) -> tuple[list[tuple[int, int]], int]:
        """(runs, queries of the whole sequence): where the ``held`` queries lie among all, as runs (first
        query, count) in the order held, for the attention-probability dropout keyed by the global query
        (``attention_core.drop_probs``)."""
        return [(0, held)], held

    def stream(self, y: Any) -> Any:
        return y


WHOLE = QueryRows()
