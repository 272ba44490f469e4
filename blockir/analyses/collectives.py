"""The collectives a tensor-parallel plan lists: which module performs each, its kind and its payload, and
which kind each layout uses where a pending sum meets the stream or the stream meets a branch."""
from __future__ import annotations

from dataclasses import dataclass

# collective that brings a row-parallel output (a pending sum) to the stream's layout, and the one that
# brings the stream to a branch input (full rows on every rank)
REDUCE = {"replicated": "all-reduce", "sequence": "reduce-scatter", "hidden": "reduce-scatter",
          "context": "reduce-scatter"}
GATHER = {"replicated": None, "sequence": "all-gather", "hidden": "all-gather", "context": "all-gather"}
# backward of a row-parallel output's reduction (the incoming gradient is whole: an all-reduce sends nothing
# back, a reduce-scatter's gradient is gathered), and of a branch input's gather (the gradient of the
# column-parallel projections is a pending sum, reduced once to the stream's layout)
REDUCE_BACKWARD = {"replicated": None, "sequence": "all-gather", "hidden": "all-gather", "context": "all-gather"}
GATHER_BACKWARD = REDUCE


@dataclass(frozen=True)
class Collective:
    site: str  # the module whose boundary performs it
    op: str  # all-reduce | all-gather | reduce-scatter
    elements: int  # logical elements of the full tensor it moves

    def wire_bytes(self, world: int, itemsize: int) -> int:
        """Bytes each rank sends in a ring implementation: (P-1)/P of the payload, twice for all-reduce."""
        factor = 2 if self.op == "all-reduce" else 1
        return factor * (world - 1) * self.elements * itemsize // world
