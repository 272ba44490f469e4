"""networkx views of a block for analyses that need graph algorithms."""
from __future__ import annotations

import networkx as nx

from blockir.ir.program import Block
from blockir.ir.traits import Sink

OUTPUT = "<output>"


def block_graph(block: Block) -> nx.DiGraph:
    """Values as nodes (plus OUTPUT), def→use edges labelled with the operand index.

    Node attribute ``op`` is the producing op (for a fused op, both of its
    results point at it); edges carry ``index``, the operand position.
    """
    g = nx.DiGraph()
    for op in block.ops:
        names = (OUTPUT,) if op.has(Sink) else op.results
        for name in names:
            g.add_node(name, op=op)
        for i, v in enumerate(op.operands):
            for name in names:
                g.add_edge(v, name, index=i)
    return g
