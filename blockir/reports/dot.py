"""Graphviz rendering: the residual stream (as the residual-structure analysis finds it) as a vertical spine,
branches beside it."""
from __future__ import annotations

from blockir.ir import ops as O
from blockir.analyses.structure import wrapper
from blockir.ir.graph import OUTPUT, block_graph
from blockir.ir.printer import format_op
from blockir.ir.program import Block


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _label(op: O.Op) -> str:
    text = format_op(op) if not isinstance(op, O.InputOp) else f"{op.result}: {op.type}"
    return text.replace("@inplace ", "") + ("  (in place)" if isinstance(op, O.AddOp) and op.inplace else "")


def block_to_dot(block: Block) -> str:
    g = block_graph(block)
    spine_set = wrapper(block).spine_set  # the residual analysis owns which values are the stream
    lines = [f"digraph {_quote(block.name)} {{", "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    for node, data in g.nodes(data=True):
        op = data.get("op")
        if node == OUTPUT:
            lines.append(f'  {_quote(node)} [label="return", shape=oval];')
            continue
        style = 'style="filled,bold", fillcolor="#dbe9ff", group=spine' if node in spine_set else 'style=rounded'
        lines.append(f"  {_quote(node)} [label={_quote(_label(op))}, {style}];")
    for a, b in g.edges():
        weight = ", weight=100, penwidth=2" if a in spine_set and (b in spine_set or b == OUTPUT) else ""
        lines.append(f"  {_quote(a)} -> {_quote(b)} [{weight.lstrip(', ')}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
