"""Graphviz rendering: the residual stream (as the residual-structure analysis finds it) as a vertical spine, branches beside it.

One ``digraph`` per rendering; several blocks become one cluster each, so ``dot -Tsvg`` draws
them on one picture. :func:`block_body` is the only part that knows how a block is drawn.
"""
from __future__ import annotations

from typing import Sequence

from blockir.analyses.structure import wrapper
from blockir.ir.graph import OUTPUT, block_graph
from blockir.ir.printer import format_op
from blockir.ir.program import Block
from blockir.ops import Op


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _label(op: Op) -> str:
    text = format_op(op)
    return text.removeprefix("@inplace ") + ("  (in place)" if text.startswith("@inplace ") else "")


def block_body(block: Block, prefix: str = "") -> list[str]:
    """Node and edge statements of one block; node ids are its value names after ``prefix``."""
    g = block_graph(block)
    spine_set = wrapper(block).spine_set  # the residual analysis owns which values are the stream
    lines = []
    for node, data in g.nodes(data=True):
        op = data.get("op")
        if node == OUTPUT:
            lines.append(f'{_quote(prefix + node)} [label="return", shape=oval];')
            continue
        style = 'style="filled,bold", fillcolor="#dbe9ff", group=spine' if node in spine_set else 'style=rounded'
        lines.append(f"{_quote(prefix + node)} [label={_quote(_label(op))}, {style}];")
    for a, b in g.edges():
        weight = ", weight=100, penwidth=2" if a in spine_set and (b in spine_set or b == OUTPUT) else ""
        lines.append(f"{_quote(prefix + a)} -> {_quote(prefix + b)} [{weight.lstrip(', ')}];")
    return lines


def blocks_to_dot(blocks: Sequence[Block], name: str | None = None) -> str:
    """One graph: a single block drawn directly, several as one cluster each (ids prefixed by block)."""
    title = name if name is not None else (blocks[0].name if len(blocks) == 1 else "program")
    lines = [f"digraph {_quote(title)} {{", "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    if len(blocks) == 1:
        lines += ["  " + s for s in block_body(blocks[0])]
    for i, b in enumerate(blocks if len(blocks) > 1 else ()):
        lines += [f"  subgraph cluster_{i} {{", f"    label={_quote(f'{b.kind} {b.name}')};"]
        lines += ["    " + s for s in block_body(b, prefix=f"{b.name}/")]
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def block_to_dot(block: Block) -> str:
    return blocks_to_dot([block])
