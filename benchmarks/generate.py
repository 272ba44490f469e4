"""Greedy decoding speed: blockir's generate (compiled model, KV cache) vs transformers' generate, same run.

A random LLaMA-style model saved with save_pretrained is loaded by both; each generates
``--new`` tokens after a ``--prompt``-token prompt for a batch of ``--batch``, without stopping
at an end-of-sequence token, alternating between the two, ``--repeat`` times. Reports the median
tokens/s (new tokens per second, whole batch) and the ratio, and checks that the outputs agree.

    python benchmarks/generate.py [--device cpu] [--batch 1] [--prompt 32] [--new 64] [--repeat 5] [--threads N]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time

import torch
import transformers
from tiny_hf import saved_model

import blockir

CONFIG = dict(model_type="llama", vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048, eos_token_id=None,
              bos_token_id=None, pad_token_id=None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    folder = saved_model(CONFIG)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).to(args.device).eval()
    ours = blockir.from_pretrained(folder, device=args.device)
    ids = torch.randint(0, CONFIG["vocab_size"], (args.batch, args.prompt), device=args.device)

    def timed(fn) -> tuple[float, torch.Tensor]:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = fn()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - start, out

    runs = {
        "transformers": lambda: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                                            min_new_tokens=args.new, do_sample=False),
        "blockir": lambda: ours.generate(ids, args.new),
    }
    for fn in runs.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    outputs = {}
    for _ in range(args.repeat):
        for name, fn in runs.items():
            seconds, outputs[name] = timed(fn)
            times[name].append(seconds)
    speed = {name: args.batch * args.new / statistics.median(t) for name, t in times.items()}
    same = torch.equal(outputs["blockir"], outputs["transformers"])
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else \
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    print(f"# {datetime.date.today()} — {where}, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"batch {args.batch}, prompt {args.prompt}, {args.new} new tokens, fp32, median of {args.repeat}")
    print("\n| generate | tokens/s | ratio to transformers |\n|---|---:|---:|")
    for name in ("transformers", "blockir"):
        print(f"| {name} | {speed[name]:.1f} | {speed[name] / speed['transformers']:.2f} |")
    print(f"\noutputs equal: {same}")


if __name__ == "__main__":
    main()
