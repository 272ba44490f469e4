"""Per-call cost of the call boundary of a compiled module: the one ``check_inputs`` call of the root (arity,
keywords, dtype, device, sizes) with no keywords and with the two an HF caller passes, and the narrowing of the
context a bound extern does before calling its adapter. CPU time per call, medians of interleaved runs.

    python benchmarks/call_boundary.py [--repeats 30] [--calls 20000]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn

import blockir
from blockir.lower import adapters as A
from blockir.lower.boundary import check_inputs, input_specs
from blockir.analyses.sizes import Sizes

TEXT = """dim B: batch
dim S: seq
dim D: model = 64
dim H: heads = 4
block L(x: [B, S, D]) -> [B, S, D] {
  n: rmsnorm(D)
  a: self_attention(heads=H, rope=true)
  f: extern(x: [B, S, D]) -> [B, S, D]
  h = x + a(n(x))
  y = h + f(h)
  return y
}
"""


def per_call(fn: Callable[[], Any], calls: int) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    program = blockir.parse(TEXT, "l.block")
    mha = nn.MultiheadAttention(64, 4, batch_first=True)
    m = blockir.compile(program, "L", bind={"f": (mha, A.multihead_attention)}, seed=0)
    contract, block = m.blockir_contract, program.block("L")
    specs = input_specs(block, Sizes.of(program).for_block(block), program)
    x = torch.randn(1, 8, 64)
    ctx = {"attention_mask": None, "position_embeddings": None}
    extern = m.get_submodule("f")
    reads = extern.blockir_context
    cases = {
        "check_inputs, no keywords": lambda: check_inputs(contract, specs, {}, (), x),
        "check_inputs, 2 keywords": lambda: check_inputs(contract, specs, ctx, (), x),
        "extern context narrowing, 2 keywords": lambda: {k: v for k, v in ctx.items() if k in reads},
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.repeats):
        for label, fn in cases.items():
            times[label].append(per_call(fn, args.calls))
    print("| what | µs a call |\n|---|---|")
    for label, ts in times.items():
        print(f"| {label} | {statistics.median(ts):.2f} |")


if __name__ == "__main__":
    main()
