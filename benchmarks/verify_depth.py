"""Verification cost vs depth: models of 1 … 10,000 layers, stacked, written out and nested.

A stack (``layers: Layer * N``) is verified once whatever N is; N distinct
blocks called one after another make the program itself N times larger, so
their cost must grow linearly. The written-out program is built as IR (one
parsed layer copied under N names, and a model calling each), because 10,000
layers of text exceed the parser's file-size limit; where the text fits, its
parse time is reported too. A nested chain of N blocks, each calling the
previous one as its first sub-layer, must verify in time linear in N too:
each block is summarised once and callers read the summary. Every measurement verifies fresh objects
(analyses cache per block object).

    python benchmarks/verify_depth.py [--max 10000] [--repeat 5] [--markdown]
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import platform
import statistics
import time

import blockir
from blockir.diagnostics import BlockError
from blockir.ir.decls import InstanceDecl
from blockir.ops import CallOp, InputOp, NormOp, OutputOp
from blockir.ir.program import Program

HEAD = "dim B: batch\ndim S: seq\ndim D: model = 64\ndim F: hidden = 128\ndim H: heads = 4\n\n"
LAYER = """block L{i}(x: [B, S, D]) -> [B, S, D] {{
  input_layernorm: rmsnorm(D, eps=1e-6)
  self_attn: self_attention(heads=H, kv_heads=2, causal=true, rope=true)
  post_attention_layernorm: rmsnorm(D, eps=1e-6)
  mlp: gated_mlp(F, act=silu)
  h = x + self_attn(input_layernorm(x))
  y = h + mlp(post_attention_layernorm(h))
  return y
}}

"""


def stacked(n: int) -> str:
    return HEAD + LAYER.format(i=0) + (
        f"model M(x: [B, S, D]) -> [B, S, D] {{\n  layers: L0 * {n}\n  norm: rmsnorm(D, eps=1e-6)\n"
        "  return norm(layers(x))\n}\n")


def written_out(n: int) -> str:
    decls = "".join(f"  l{i}: L{i}\n" for i in range(n))
    calls = "".join(f"  h{i} = l{i}({'x' if i == 0 else f'h{i - 1}'})\n" for i in range(n))
    return HEAD + "".join(LAYER.format(i=i) for i in range(n)) + (
        f"model M(x: [B, S, D]) -> [B, S, D] {{\n{decls}  norm: rmsnorm(D, eps=1e-6)\n{calls}"
        f"  return norm(h{n - 1})\n}}\n")


NESTED = """block C{i}(x: [B, S, D]) -> [B, S, D] {{
  inner: C{prev}
  n: rmsnorm(D, eps=1e-6)
  mlp: gated_mlp(F, act=silu)
  h = inner(x)
  y = h + mlp(n(h))
  return y
}}

"""


def nested(n: int) -> str:
    """C0 is a LLaMA layer; C{i} calls C{i-1} and adds one more MLP update: N nested blocks."""
    return HEAD + LAYER.format(i=0).replace("block L0", "block C0") + "".join(
        NESTED.format(i=i, prev=i - 1) for i in range(1, n))


def written_out_ir(n: int) -> Program:
    """The program of ``written_out(n)``, built from one parsed layer: N distinct blocks and a model calling each."""
    one = blockir.parse(written_out(1))
    layer, model = one.block("L0"), one.block("M")
    x = next(op for op in model.ops if isinstance(op, InputOp))
    norm = next(op for op in model.ops if isinstance(op, NormOp))
    calls = [CallOp(f"h{i}", layer.result, f"l{i}", ("x" if i == 0 else f"h{i - 1}",)) for i in range(n)]
    decls = tuple(InstanceDecl(f"l{i}", f"L{i}") for i in range(n)) + (model.decl_map[norm.decl],)
    ops = (x, *calls, dataclasses.replace(norm, operand=f"h{n - 1}"), OutputOp(norm.result))
    blocks = tuple(dataclasses.replace(layer, name=f"L{i}") for i in range(n))
    return dataclasses.replace(one, blocks=blocks + (dataclasses.replace(model, decls=decls, ops=ops),))


def verify_seconds(build, repeat: int) -> float:
    """Median time of blockir.verify over ``repeat`` freshly built programs."""
    times = []
    for _ in range(repeat):
        program = build()
        gc.collect()  # start each timing from a clean heap, not amid the previous program's garbage
        t0 = time.perf_counter()
        diags = blockir.verify(program)
        times.append(time.perf_counter() - t0)
        assert not diags, diags
    return statistics.median(times)


def parse_seconds(text: str) -> float | None:
    """Time to parse ``text``, or None when it exceeds the parser's limits."""
    t0 = time.perf_counter()
    try:
        blockir.parse(text)
    except BlockError:
        return None
    return time.perf_counter() - t0


def machine() -> str:
    """CPU model and count as the OS reports them."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    system = f"{platform.system()} {platform.release()}"
    return f"{cpu} ({os.cpu_count()} CPUs), Python {platform.python_version()}, {system}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max", type=int, default=10_000, help="largest depth (default 10000)")
    ap.add_argument("--repeat", type=int, default=5, help="fresh parses per size below 1000 layers (default 5)")
    ap.add_argument("--markdown", action="store_true", help="print a section for docs/benchmarks.md")
    args = ap.parse_args()
    blockir.verify(blockir.parse(stacked(1)))  # import every verifier before timing
    rows = []
    for n in (d for d in (1, 10, 100, 1_000, 10_000) if d <= args.max):
        repeat = args.repeat if n < 10_000 else 1
        stack_s = verify_seconds(lambda: blockir.parse(stacked(n)), repeat)
        out_s = verify_seconds(lambda: written_out_ir(n), repeat)
        rows.append((n, stack_s, out_s, parse_seconds(written_out(n))))
    nested_rows = []
    for n in (d for d in (10, 100, 300, 1_000) if d <= args.max):
        text = nested(n)
        nested_rows.append((n, verify_seconds(lambda: blockir.parse(text), args.repeat)))
    header = "| layers | stack: verify (ms) | written out: verify (ms) | per layer (µs) | written out: parse (s) |"
    lines = [header, "|---:|---:|---:|---:|---:|"]
    lines += [f"| {n:,} | {s * 1e3:.2f} | {o * 1e3:.1f} | {o / n * 1e6:.0f} | "
              f"{f'{p:.2f}' if p is not None else 'over the 1 MiB file limit'} |" for n, s, o, p in rows]
    if args.markdown:
        print("\n## Verification cost vs depth\n")
        print(f"Machine: {machine()}.  ")
        print(f"Command: `python benchmarks/verify_depth.py --max {args.max} --markdown`.  ")
        print(f"Date: {time.strftime('%Y-%m-%d')}.\n")
        print("Each layer is LLaMA-style Pre-RMSNorm. \"stack\" is `layers: L0 * N`; \"written out\" is N distinct "
              "blocks called in sequence by one model. Verify times are for `blockir.verify` on freshly built "
              "programs (median of 5 below 10,000 layers, one run at 10,000); the parse column times the "
              "written-out text where it fits in one file.\n")
    print("\n".join(lines))
    print("\nNested chain (block i calls block i-1, then adds one update):\n")
    print("| nested blocks | verify (ms) | per block (µs) |\n|---:|---:|---:|")
    print("\n".join(f"| {n:,} | {s * 1e3:.1f} | {s / n * 1e6:.0f} |" for n, s in nested_rows))


if __name__ == "__main__":
    main()
