"""Compile time of a deep LLaMA model vs constructing its modules, on the meta device.

Three ways to build N LLaMA decoder layers at D=4096, F=11008 (32 heads, 8 KV
heads) with every parameter on ``torch.device("meta")``:

* ``bare``: only the modules that hold parameters, seven ``nn.Linear`` and two
  ``nn.RMSNorm`` per layer, in an ``nn.ModuleList``: the floor any builder pays;
* ``hf``: ``transformers``' ``LlamaDecoderLayer`` built from a ``LlamaConfig``;
* ``blockir``: ``blockir.compile`` of ``examples/llama.block`` with a stack of N
  layers (parse and verify are included; they do not depend on N).

The three are interleaved over ``--repeats`` rounds so that machine noise hits
each alike; times are the process's CPU time (``time.process_time``), which other
jobs on a shared machine disturb far less than wall time. The table reports the
median and the fastest run and their ratios to ``bare``.

    python benchmarks/compile_depth.py [--layers 1000] [--repeats 5] [--markdown]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn

import blockir

ROOT = Path(__file__).resolve().parent.parent
LLAMA = (ROOT / "examples" / "llama.block").read_text()
D, F, HEADS, KV = 4096, 11008, 32, 8


def bare(n: int) -> nn.Module:
    layers = nn.ModuleList()
    kv = D // HEADS * KV
    for _ in range(n):
        layer = nn.Module()
        layer.q_proj = nn.Linear(D, D, bias=False)
        layer.k_proj = nn.Linear(D, kv, bias=False)
        layer.v_proj = nn.Linear(D, kv, bias=False)
        layer.o_proj = nn.Linear(D, D, bias=False)
        layer.gate_proj = nn.Linear(D, F, bias=False)
        layer.up_proj = nn.Linear(D, F, bias=False)
        layer.down_proj = nn.Linear(F, D, bias=False)
        layer.input_layernorm = nn.RMSNorm(D, eps=1e-6)
        layer.post_attention_layernorm = nn.RMSNorm(D, eps=1e-6)
        layers.append(layer)
    return layers


def hf(n: int) -> nn.Module:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    cfg = LlamaConfig(hidden_size=D, intermediate_size=F, num_attention_heads=HEADS, num_key_value_heads=KV,
                      num_hidden_layers=n, vocab_size=32)
    return nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(n))


def ours(n: int) -> nn.Module:
    # the sizes go into the text: check verifies the file's own sizes (kv_heads=8 must divide heads)
    text = LLAMA.replace("LlamaDecoderLayer * 2", f"LlamaDecoderLayer * {n}").replace("kv_heads=2", f"kv_heads={KV}")
    for old, new in (("dim D: model = 64", f"dim D: model = {D}"), ("dim F: hidden = 2 * D", f"dim F: hidden = {F}"),
                     ("dim H: heads = 4", f"dim H: heads = {HEADS}")):
        text = text.replace(old, new)
    return blockir.compile(blockir.parse(text, "llama.block"), "LlamaModel", device="meta")


def timed(build, n: int) -> float:
    gc.collect()
    # blockir.compile(device="meta") enters the meta device itself; the others run under it
    place = torch.device("meta") if build is not ours else contextlib.nullcontext()
    with place:
        t0 = time.process_time()
        module = build(n)
        elapsed = time.process_time() - t0
    assert all(p.is_meta for p in module.parameters())
    del module
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    builders = {"bare nn.Linear + nn.RMSNorm": bare, "HF LlamaDecoderLayer": hf, "blockir.compile": ours}
    for build in builders.values():  # warm-up: imports, first-call caches
        timed(build, 2)
    times: dict[str, list[float]] = {k: [] for k in builders}
    for _ in range(args.repeats):
        for name, build in builders.items():
            times[name].append(timed(build, args.layers))
    floor = statistics.median(times["bare nn.Linear + nn.RMSNorm"])
    print(f"# compile depth — {datetime.date.today()} — {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}, {args.layers} layers at D={D} F={F}, median of {args.repeats}\n")
    fastest = min(times["bare nn.Linear + nn.RMSNorm"])
    print("| builder | median s | per layer ms | median / bare | min s | min / bare |\n|---|---:|---:|---:|---:|---:|")
    for name, ts in times.items():
        med, low = statistics.median(ts), min(ts)
        print(f"| {name} | {med:.3f} | {med / args.layers * 1e3:.3f} | {med / floor:.3f} | {low:.3f} | "
              f"{low / fastest:.3f} |")
    if not args.markdown:
        print("\nall runs (s):", {k: [round(t, 3) for t in v] for k, v in times.items()})


if __name__ == "__main__":
    main()
