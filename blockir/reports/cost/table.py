"""The ledger as a table for people and as JSON-ready data (``blockir cost``, ``--json``)."""
from __future__ import annotations

import textwrap
from typing import Any

from blockir.analyses.shortcut_weights import describe, route_summary
from blockir.reports.cost.counts import BlockCost, Ledger, Tally

MIB = 1 << 20
SCOPE = ("branch internals (attention, MLP, projections, activations) are not counted: only the residual "
         "wrapper (adds, scales, dropouts, casts, norms)")


def _mib(n: int) -> str:
    return f"{n / MIB:,.2f} MiB"


def _per_row(n: int, rows: int) -> str:
    return f"{n / rows:g}" if rows else "0"


def _rows_of(b: BlockCost, carried: bool = False) -> list[tuple[str, str]]:
    u, f = b.unfused, b.fused
    params = ", ".join(f"{k} {v:,}" for k, v in sorted(u.norm_params.items())) or "none"
    return [
        ("instances", f"{b.instances:,}"),
        ("residual elements", f"{b.residual_elements:,}"),
        ("bytes per residual tensor", _mib(b.bytes_per_tensor)),
        *([("bytes of carried streams", _mib(b.carried_bytes))] if carried else []),
        ("residual adds", f"{u.adds:,}"),
        ("norm parameters", f"{u.norm_parameters:,}"),
        ("  by family", params),
        ("row reductions fwd / bwd", f"{u.reductions_forward:,} / {u.reductions_backward:,}"),
        ("  per state row", f"{_per_row(u.reductions_forward, b.rows)} / {_per_row(u.reductions_backward, b.rows)}"),
        ("bytes moved, unfused", _mib(u.bytes_moved)),
        ("bytes moved, fused", _mib(f.bytes_moved)),
        ("saved for backward, unfused", _mib(u.saved_bytes)),
        ("saved for backward, fused", _mib(f.saved_bytes)),
    ]


def format_ledger(led: Ledger) -> str:
    """A table: one column per block (one instance; the root column is the whole model)."""
    sizes = ", ".join(f"{k}={v:,}" for k, v in led.dims.items())
    head = [f"cost of {led.root} in {led.filename} ({sizes}; {led.dtype.value} where a type leaves the dtype open; "
            "training forward)"]
    carried = any(b.carried_bytes for b in led.blocks)
    columns = [[label for label, _ in _rows_of(led.total, carried)]]
    titles = [""]
    for b in led.blocks:
        columns.append([v for _, v in _rows_of(b, carried)])
        titles.append(b.name + (" (whole)" if b is led.total and len(led.blocks) > 1 else ""))
    widths = [max(len(t), *(len(v) for v in col)) for t, col in zip(titles, columns)]
    lines = ["  ".join(t.ljust(w) if i == 0 else t.rjust(w) for i, (t, w) in enumerate(zip(titles, widths)))]
    for r in range(len(columns[0])):
        lines.append("  ".join(col[r].ljust(w) if i == 0 else col[r].rjust(w)
                               for i, (col, w) in enumerate(zip(columns, widths))))
    notes = ("each column is one instance of a block with its sub-blocks; stacks multiply, sub-blocks add. "
             "bytes: each wrapper op reads every operand once and writes every result once at its dtype; a norm "
             "also writes its row statistics; fused: after the add+norm fusion pass, each boundary one kernel. "
             "saved: what backward keeps (a norm's input and row statistics, a learned scale's input, a fused "
             "op's residual_out and statistics, plus its branch under a learned scale); dropout keeps no mask; "
             f"parameters are not counted. {SCOPE[0].upper()}{SCOPE[1:]}.")
    lines += [""] * bool(led.depth) + [describe(s) for s in led.depth]
    if led.size is not None:
        lines += ["", f"parameters {led.size.parameters:,}; forward matmul FLOPs {led.size.matmul_flops:,} "
                  "(2 × tokens × each projection matrix, plus 4 × B × S² × heads × head_dim per self-attention)"]
    return "\n".join(head + [""] + lines + [""] + textwrap.wrap(notes, 100)) + "\n"


def _tally_data(t: Tally) -> dict[str, Any]:
    return {"residual_adds": t.adds, "norm_parameters": t.norm_parameters, "norm_parameters_by_family":
            dict(sorted(t.norm_params.items())), "row_reductions": {"forward": t.reductions_forward,
                                                                    "backward": t.reductions_backward}}


def ledger_data(led: Ledger) -> dict[str, Any]:
    """The ledger as JSON-ready data: bytes are exact integers."""
    def block(b: BlockCost) -> dict[str, Any]:
        return {"name": b.name, "instances": b.instances, "state": b.state, "rows": b.rows,
                "residual_elements": b.residual_elements, "bytes_per_tensor": b.bytes_per_tensor,
                **({"carried_bytes": b.carried_bytes} if b.carried_bytes else {}),
                **_tally_data(b.unfused),
                "bytes_moved": {"unfused": b.unfused.bytes_moved, "fused": b.fused.bytes_moved},
                "saved_bytes": {"unfused": b.unfused.saved_bytes, "fused": b.fused.saved_bytes}}
    return {"file": led.filename, "block": led.root, "dims": dict(led.dims), "dtype": led.dtype.value,
            "mode": "train", "scope": SCOPE, "blocks": [block(b) for b in led.blocks], "total": block(led.total),
            **({"parameters": led.size.parameters, "matmul_flops_forward": led.size.matmul_flops}
               if led.size is not None else {}),
            "shortcut_weights": [{**s.data(), "summary": route_summary(s)} for s in led.depth]}
