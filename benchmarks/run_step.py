"""Training step time: `blockir run`'s step (the folder's compiled model) vs a plain PyTorch loop over
transformers' own model, same run, same data, same optimizer.

A random LLaMA-style model saved with save_pretrained is loaded by both: blockir through
``from_pretrained`` into the trainer `blockir run FOLDER` uses, transformers through
``AutoModelForCausalLM.from_pretrained``. Each step draws one batch of byte windows from the
Python standard library's source (the run's default data); both sides take that same batch
(forward, next-token cross-entropy in fp32, backward, AdamW with lr 3e-3 and weight decay 0.01),
alternating, ``--steps`` times after ``--warmup`` untimed steps. Reports the median step time of
each, the ratio, and the largest difference of their losses (they start from the same weights).

    python benchmarks/run_step.py [--device cpu] [--dtype fp32|bf16] [--compile] [--batch 8] [--seq 128]
                                  [--accum 1] [--steps 10] [--warmup 2] [--threads N]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from typing import Callable

import torch
import transformers
from tiny_hf import saved_model
from torch.nn import functional as F

from blockir.lifecycle.corpus import load_corpus
from blockir.lifecycle.placement import autocast
from blockir.lifecycle.pretrained import pretrained_for_training
from blockir.lifecycle.session import RunConfig, Trainer

CONFIG = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--compile", action="store_true", help="torch.compile both forwards (inductor)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    folder = saved_model(CONFIG)
    place = torch.device(args.device)

    lm = pretrained_for_training(folder)
    cfg = RunConfig(dims={"B": args.batch, "S": args.seq}, accum=args.accum, device=args.device, dtype=args.dtype,
                    compile="inductor" if args.compile else None)
    corpus = load_corpus(None)
    ours = Trainer(lm.program, lm.program.block(lm.name), cfg, corpus, lm.compiled)

    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(place).train()
    if args.compile:
        hf.compile()
    opt = torch.optim.AdamW(hf.parameters(), lr=3e-3, weight_decay=0.01)

    def plain(batch: torch.Tensor) -> float:
        batch = batch.to(place)
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=place)
        for micro in batch.split(args.batch):
            with autocast(args.dtype, place):
                logits = hf(input_ids=micro[:, :-1]).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), micro[:, 1:].reshape(-1))
            loss = loss * (micro.shape[0] / batch.shape[0])
            loss.backward()
            total += loss.detach()
        opt.step()
        return total.item()

    def timed(fn: Callable[[torch.Tensor], float], batch: torch.Tensor) -> tuple[float, float]:
        if place.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = fn(batch)
        if place.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, loss

    runs = {"plain loop (transformers)": plain, "blockir run": ours.train_step}
    times: dict[str, list[float]] = {name: [] for name in runs}
    losses: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(args.warmup + args.steps):
        batch = ours.next_batch()
        for name, fn in runs.items():
            seconds, loss = timed(fn, batch)
            losses[name].append(loss)
            if step >= args.warmup:
                times[name].append(seconds)
    median = {name: statistics.median(t) for name, t in times.items()}
    where = torch.cuda.get_device_name(place) if place.type == "cuda" else \
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    tokens = args.batch * args.accum * args.seq
    print(f"# {datetime.date.today()} — {where}, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"batch {args.batch} x {args.accum} x {args.seq} tokens, {args.dtype}"
          f"{', torch.compile' if args.compile else ''}, median of {args.steps} steps after {args.warmup}")
    print("\n| training step | ms/step | tokens/s | ratio to the plain loop |\n|---|---:|---:|---:|")
    base = median["plain loop (transformers)"]
    for name, seconds in median.items():
        print(f"| {name} | {seconds * 1e3:.1f} | {tokens / seconds:,.0f} | {seconds / base:.2f} |")
    gap = max(abs(a - b) for a, b in zip(*losses.values()))
    print(f"\nlargest loss difference over {args.warmup + args.steps} steps: {gap:.2e}")


if __name__ == "__main__":
    main()
