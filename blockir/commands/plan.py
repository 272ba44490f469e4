"""`blockir plan FILE [--block B] --tp N [--layout sequence|hidden|replicated|context] [--vocab-parallel] [--dims …]
[--dtype …]`: the tensor-parallel plan a block implies — each parameter's placement, the stream's layout at
block boundaries, and each layer's forward and backward collectives with the bytes they move, summed per step
(with ``--vocab-parallel``, also those of the embedding, the head and the cross-entropy of logits split by
vocabulary)."""
from __future__ import annotations

import argparse

from blockir.cli import (EXIT_OK, UsageError, add_block_option, add_dims_option, add_format_option, print_json,
                         with_program)
from blockir.ir.program import Block, Program
from blockir.ir.types import DType

# Closed forms per layer and forward pass, stream of B·S·D elements (Korthikanti et al., 2022, table 2):
# tensor parallelism all-reduces the attention and MLP outputs; sequence parallelism replaces each
# all-reduce by an all-gather before the branch and a reduce-scatter after it. Context parallelism sends
# no stream: each attention all-gathers its keys and values (B·S·kv_heads·head_dim elements each).
# the cross-entropy casts the logits to fp32 (blockir.lower.distributed.loss), whatever the activations' dtype
FP32 = 4
CLOSED_FORM = {"replicated": {"all-reduce": 2}, "sequence": {"all-gather": 2, "reduce-scatter": 2},
               "hidden": {"all-gather": 2, "reduce-scatter": 2, "all-reduce": 2}, "context": {"all-gather": 2}}
# what each layout's closed form counts
OF = {"replicated": "of the stream", "sequence": "of the stream",
      "hidden": "of the stream (hidden: one all-reduce per norm of its row sums, Σx² or Σx and Σx²)",
      "context": "of the attention's keys and of its values, B·S·kv_heads·head_dim elements each; backward, their "
                 "reduce-scatters"}


def run(args: argparse.Namespace) -> int:
    if args.tp < 1:
        raise UsageError(f"--tp must be a positive integer, got {args.tp}")

    def show(program: Program, block: Block) -> int:
        from blockir.analyses.parallel import STREAM, derive_plan, stream_type
        from blockir.analyses.sizes import Sizes
        plan = derive_plan(program, block, Sizes.of(program, args.dims), args.layout, args.tp,
                           vocab=args.vocab_parallel)
        itemsize = DType(args.dtype).itemsize
        unit = "per token" if plan.per_token else "per step"

        def rows(cs: list, size: int = itemsize) -> list[dict]:  # type: ignore[type-arg]
            return [dict(site=c.site, op=c.op, elements=c.elements, bytes=c.elements * size,
                         wire_bytes=c.wire_bytes(args.tp, size)) for c in cs]
        layers = {layer or block.name: rows(cs) for layer, cs in plan.collectives.items()}
        backward = {layer or block.name: rows(cs) for layer, cs in plan.backward.items()}
        loss = rows(plan.loss, FP32)
        forward_all = [c for cs in layers.values() for c in cs] + loss
        backward_all = [c for cs in backward.values() for c in cs]
        totals = {"forward": _total(forward_all), "backward": _total(backward_all),
                  "step": _total(forward_all + backward_all)}
        stream = STREAM[args.layout]
        pending = _pending_gradients(program, block, args.dims, plan.params)
        if args.format == "json":
            print_json({"block": block.name, "tp": args.tp, "layout": args.layout, "vocab_parallel": plan.vocab,
                        "dtype": args.dtype, "sizes": unit, "stream": stream, "params": plan.params,
                        "modules": plan.styles(), "collectives": layers, "backward": backward,
                        "loss_collectives": loss, "totals": totals, "closed_form": CLOSED_FORM[args.layout],
                        "pending_gradient_elements": pending})
            return EXIT_OK
        print(f"{block.kind} {block.name}: tp={args.tp}, layout {args.layout}, stream [{', '.join(stream_type(program, block).names)}; "
              f"tp={stream}] at every block boundary")
        print("parameters:")
        width = max((len(k) for k in plan.params), default=0)
        for key, placement in plan.params.items():
            print(f"  {key.ljust(width)}  {placement}")
        shown = dict(layers)
        if plan.loss:
            shown["cross-entropy of the split logits (loss_parallel, f32)"] = loss
        for phase, listed in (("forward", shown), ("backward", backward)):
            print(f"{phase} collectives, {args.dtype}, {unit}:")
            for layer, cs in listed.items():
                print(f"  {layer}:")
                for c in cs:
                    print(f"    {c['op']:<14} at {c['site'] or '(model boundary)':<32} {c['bytes']:>10} B payload, {c['wire_bytes']:>10} B sent per rank")
        if plan.vocab:
            print("vocabulary split by rows; the loss's backward sends nothing")
        print(f"total {unit}:")
        for phase, t in totals.items():
            print(f"  {phase:<8} {t['collectives']:>4} collectives, {t['elements']:>12} elements, {t['bytes']:>12} B payload, "
                  f"{t['wire_bytes']:>12} B sent per rank")
        if args.layout == "context":  # every weight's: each rank saw only its rows
            print(f"parameter gradients, pending sums over the ranks: {pending} elements, all-reduced when read "
                  "whole (an optimizer step), not listed above")
        forms = ", ".join(f"{n} {op}" for op, n in CLOSED_FORM[args.layout].items())
        print(f"closed form per layer ({args.layout}): {forms} {OF[args.layout]}")
        return EXIT_OK
    return with_program(args, show)


def _pending_gradients(program: Program, block: Block, dims: object, params: dict[str, str]) -> int:
    """Elements of the parameters whose gradient each rank holds a summand of (``… gradient summed …``)."""
    from math import prod
    from blockir.analyses.keys import param_keys
    shapes = {k.name: k.shape for k in param_keys(program, block.name, dims).keys}  # type: ignore[arg-type]
    return sum(prod(shapes[key]) for key, placement in params.items() if "summed" in placement and key in shapes)


def _total(cs: list[dict]) -> dict[str, int]:  # type: ignore[type-arg]
    return {"collectives": len(cs), **{k: sum(c[k] for c in cs) for k in ("elements", "bytes", "wire_bytes")}}


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("plan", help="the tensor-parallel plan: parameter placements, stream layout, collectives")
    s.add_argument("file", metavar="FILE")
    add_block_option(s)
    s.add_argument("--tp", type=int, required=True, help="tensor-parallel degree")
    s.add_argument("--layout", choices=("sequence", "hidden", "replicated", "context"), default="sequence",
                   help="where the residual stream lives between blocks (default: sequence); context: rows split "
                        "through attention too, weights replicated")
    s.add_argument("--vocab-parallel", action="store_true",
                   help="split the token embedding and the head by vocabulary rows; the logits stay split for a "
                        "cross-entropy under loss_parallel (blockir.parallelize(..., vocab=True))")
    s.add_argument("--dtype", choices=[d.value for d in DType], default="bf16", help="activation dtype for bytes")
    add_dims_option(s, "B=8,S=2048")
    add_format_option(s)
    s.set_defaults(func=run)
