"""Peak activation memory of a 24-layer LLaMA-style forward in inference: in-place vs out-of-place.

Compiles examples/llama.block's model with 24 layers twice — mode="train" (every residual add
allocates) and mode="infer" (adds the liveness plan allows write over the shortcut's buffer) —
runs one forward under torch.inference_mode, and counts peak bytes of storages created during
the call at the dispatcher (blockir.lower.memory.LiveBytes): exact and repeatable on CPU.

    python benchmarks/memory.py [--layers 24] [--dims B=4,S=256,D=512]
"""
from __future__ import annotations

import argparse
import datetime
import platform

import torch

import blockir
from blockir.lower.memory import peak_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--dims", default="B=4,S=256,D=512,F=1408,H=8")
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (item.split("=") for item in args.dims.split(","))}
    text = open("examples/llama.block").read().replace("LlamaDecoderLayer * 2", f"LlamaDecoderLayer * {args.layers}")
    program = blockir.parse(text, "llama.block")
    x = torch.randn(dims["B"], dims["S"], dims["D"])
    tensor_mib = x.numel() * x.element_size() / 2**20
    print(f"# {datetime.date.today()} — {platform.machine()}, torch {torch.__version__}; "
          f"{args.layers} layers, {args.dims}, fp32; one [B,S,D] tensor = {tensor_mib:.1f} MiB")
    print("\n| mode | peak MiB | peak / [B,S,D] | output equal |\n|---|---|---|---|")
    results = {}
    for mode in ("train", "infer"):
        m = blockir.compile(program, "LlamaModel", dims=dims, seed=0, mode=mode).eval()
        existing = (x, *m.parameters(), *m.buffers())
        with torch.inference_mode():
            results[mode] = m(x)
            peak = peak_bytes(lambda: m(x), existing)
        same = torch.equal(results[mode], results["train"])
        print(f"| {'out-of-place (mode=train)' if mode == 'train' else 'in-place (mode=infer)'} | "
              f"{peak / 2**20:.1f} | {peak / 2**20 / tensor_mib:.2f} | {same} |")


if __name__ == "__main__":
    main()
