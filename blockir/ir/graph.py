"""networkx views of a block for analyses that need graph algorithms."""
from __future__ import annotations

import networkx as nx

from blockir.ir.ops import InputOp, OutputOp, results_of
from blockir.ir.program import Block

OUTPUT = "<output>"


def block_graph(block: Block) -> nx.DiGraph:
    """Values as nodes (plus OUTPUT), def→use edges labelled with the operand index.

    Node attribute ``op`` is the producing op (for a fused op, both of its
    results point at it); edges carry ``index``, the operand position.
    """
    g = nx.DiGraph()
    for op in block.ops:
        names = results_of(op) if not isinstance(op, OutputOp) else (OUTPUT,)
        for name in names:
            g.add_node(name, op=op)
        for i, v in enumerate(op.operands):
            for name in names:
                g.add_edge(v, name, index=i)
    return g


def residual_spine(block: Block) -> list[str]:
    """Values every path from the first input to the output passes through, in order.

    In a sequential block these are the input, each residual state and the
    output; branches hang off the spine.
    """
    inputs = [op.result for op in block.ops if isinstance(op, InputOp)]
    if not inputs or block.output is None:
        return []
    g = block_graph(block)
    reach = nx.descendants(g, inputs[0]) | {inputs[0]}
    if OUTPUT not in reach:
        return [inputs[0]]
    sub = g.subgraph(n for n in reach if OUTPUT in nx.descendants(g, n) or n == OUTPUT)
    idom = nx.immediate_dominators(sub, inputs[0])
    chain, node = [], OUTPUT
    while True:
        chain.append(node)
        if node == inputs[0]:
            break
        node = idom[node]
    return [n for n in reversed(chain) if n != OUTPUT]
