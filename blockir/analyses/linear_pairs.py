"""Two linears written out as an MLP: the first widens the stream, elementwise functions follow, the second
narrows it back (OPT's fc1/fc2, BERT's intermediate.dense/output.dense, which HF stores as the layer's own
children, so the importer cannot declare them as one ``mlp``).

Such a pair splits as the ``mlp`` kind does (Shoeybi et al., 2019): the first by output columns, the second by
input rows, every function between them acting on each rank's own hidden units. A function that draws random values
(BioGPT's activation dropout) is one of them too: the hidden units stay a DTensor split by columns between the
two linears, so each rank draws the decisions of the global units it holds (``numerics._sharded_dropout``).
"""
from __future__ import annotations

from blockir.ir.decls import KindDecl
from blockir.ir.program import Block
from blockir.ir.traits import Elementwise
from blockir.ops import Op


def _calls(block: Block, name: str) -> list[Op]:
    return [op for op in block.ops if op.applied == (name,)]


def _only_user(block: Block, value: str) -> Op | None:
    users = block.users.get(value, ())
    return users[0] if len(users) == 1 else None


def linear_pairs(block: Block, stream_axis: str) -> dict[str, str]:
    """Declaration name → ``"columns"`` (the widening linear) or ``"rows"`` (the narrowing one) for every pair of
    ``block`` that maps the stream's features (``stream_axis``) to themselves, each linear applied once."""
    out: dict[str, str] = {}
    for d in block.decls:
        if not (isinstance(d, KindDecl) and d.kind == "linear" and d.arg("in_dim") == stream_axis):
            continue
        calls = _calls(block, d.name)
        if len(calls) != 1:
            continue
        op = _only_user(block, calls[0].result)
        while op is not None and op.has(Elementwise) and len(op.operands) == 1:
            op = _only_user(block, op.result)
        second = block.decl_map.get(op.applied[0]) if op is not None and len(op.applied) == 1 else None
        if isinstance(second, KindDecl) and second.kind == "linear" and second.arg("in_dim") == d.arg("out_dim") \
                and second.arg("out_dim") == stream_axis and len(_calls(block, second.name)) == 1 \
                and second.name not in out:
            out[d.name], out[second.name] = "columns", "rows"
    return out
