"""Compiled blockir module vs the real HF module with the same weights, on CPU.

Measures forward and forward+backward time of LlamaDecoderLayer at a tiny
shape (Python overhead dominates) and a medium one, interleaving the two
candidates so drift hits both, and reports blockir/HF time ratios; then the
cost of the input check a compiled module runs on its inputs (the same module
with and without it, and the check alone); then the compile time (parse +
verify + lower with weights on the meta device) of LLaMA-style models with 1,
10, 100 and 1000 layers; last, whole imported models (`blockir import hf`, the SDPA fast path)
against the HF model with its eager attention, on token ids with a padding mask.

    python benchmarks/overhead.py [--repeats 30]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time

import torch

import blockir

LLAMA_TEXT = open("examples/llama.block").read()


def build(width: int, inter: int, heads: int, kv: int):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=width, intermediate_size=inter, num_attention_heads=heads,
                      num_key_value_heads=kv, num_hidden_layers=1, vocab_size=32)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    real = LlamaDecoderLayer(cfg, 0).eval()
    text = LLAMA_TEXT.replace("kv_heads=2", f"kv_heads={kv}")
    m = blockir.compile(blockir.parse(text, "llama.block"), "LlamaDecoderLayer",
                        dims={"D": width, "F": inter, "H": heads}).eval()
    m.load_state_dict(real.state_dict(), strict=True)
    return real, m, LlamaRotaryEmbedding(cfg)


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def compare(label: str, b: int, s: int, width: int, inter: int, heads: int, kv: int, repeats: int) -> list[str]:
    real, m, rope = build(width, inter, heads, kv)
    x = torch.randn(b, s, width)
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    cos_sin = rope(x, pos)
    rows = []
    for mode in ("forward", "forward+backward"):
        xg = x.clone().requires_grad_(mode != "forward")

        def run_real():
            with torch.set_grad_enabled(mode != "forward"):
                y = real(xg, position_embeddings=cos_sin, attention_mask=None)
                y = y[0] if isinstance(y, tuple) else y
                if mode != "forward":
                    y.sum().backward()

        def run_ours():
            with torch.set_grad_enabled(mode != "forward"):
                y = m(xg, position_embeddings=cos_sin)
                if mode != "forward":
                    y.sum().backward()

        for fn in (run_real, run_ours):
            timed(fn, 5)  # warm-up
        t_real, t_ours = [], []
        for _ in range(repeats):  # interleave so machine noise hits both
            t_real += timed(run_real, 1)
            t_ours += timed(run_ours, 1)
        mr, mo = statistics.median(t_real), statistics.median(t_ours)
        rows.append(f"| {label} B={b} S={s} D={width} | {mode} | {mr * 1e3:.3f} | {mo * 1e3:.3f} | {mo / mr:.3f} |")
    return rows


def input_check(repeats: int) -> list[str]:
    """Forward of a tiny LlamaDecoderLayer with and without the input check, and the check alone."""
    from blockir.lower.boundary import check_inputs
    from blockir.lower.fx import lower_block
    from blockir.analyses.sizes import Sizes

    program = blockir.parse(LLAMA_TEXT, "llama.block")
    checked = blockir.compile(program, "LlamaDecoderLayer", seed=0).eval()
    plain = lower_block(program, program.block("LlamaDecoderLayer"), Sizes.of(program), {}).eval()
    plain.load_state_dict(checked.state_dict())
    x = torch.randn(1, 8, 64)
    spec = next(n for n in checked.graph.nodes if n.target is check_inputs).args[:3]

    def cpu_per_call(fn, calls: int = 200) -> float:
        # CPU time of this thread: other jobs on a shared machine disturb it far less than wall time
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        return (time.thread_time() - t0) / calls

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # every op on this thread, so thread time is the whole cost
    with torch.no_grad():
        for fn in (lambda: checked(x), lambda: plain(x)):
            cpu_per_call(fn, 50)
        t_checked, t_plain = [], []
        for _ in range(repeats):
            t_checked.append(cpu_per_call(lambda: checked(x)))
            t_plain.append(cpu_per_call(lambda: plain(x)))
    alone = [cpu_per_call(lambda: check_inputs(*spec, x), 10000) for _ in range(repeats)]
    torch.set_num_threads(threads)
    mc, mp = statistics.median(t_checked), statistics.median(t_plain)
    return [f"| tiny B=1 S=8 D=64, forward | {mp * 1e6:.1f} | {mc * 1e6:.1f} | {(mc - mp) * 1e6:+.1f} | "
            f"{mc / mp:.3f} | {statistics.median(alone) * 1e6:.2f} |"]


MODELS = {  # small whole models: Python overhead and the mask path matter as much as the matmuls
    "llama": dict(model_type="llama", num_key_value_heads=2),
    "qwen2": dict(model_type="qwen2", num_key_value_heads=2),
    "gemma": dict(model_type="gemma", num_key_value_heads=2, head_dim=64),
    "gpt2": dict(model_type="gpt2", n_embd=256, n_layer=4, n_head=4, n_positions=256),
}


def whole_models(repeats: int) -> list[str]:
    import transformers

    from blockir.api import hf_block_text as block_text

    rows = []
    for name, extra in MODELS.items():
        cfg = transformers.AutoConfig.for_model(**{**dict(vocab_size=1000, hidden_size=256, intermediate_size=688,
                                                          num_hidden_layers=4, num_attention_heads=4), **extra})
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        real = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        program = blockir.parse(block_text(real.config.to_dict()), name)
        model_name = next(line.split()[1].split("(")[0] for line in block_text(real.config.to_dict()).splitlines()
                          if line.startswith("model "))
        ours = blockir.compile(program, model_name, seed=0).eval()
        ours.load_state_dict(real.state_dict(), strict=True)
        ids = torch.randint(0, 1000, (4, 128), generator=torch.Generator().manual_seed(1))
        keep = torch.ones(4, 128, dtype=torch.long)
        keep[1, -16:] = 0
        for mode in ("forward", "forward+backward"):
            def run_real(mode=mode):
                with torch.set_grad_enabled(mode != "forward"):
                    y = real(input_ids=ids, attention_mask=keep, use_cache=False).logits
                    if mode != "forward":
                        y.sum().backward()

            def run_ours(mode=mode):
                with torch.set_grad_enabled(mode != "forward"):
                    y = ours(ids, attention_mask=keep)
                    if mode != "forward":
                        y.sum().backward()

            for fn in (run_real, run_ours):
                timed(fn, 3)  # warm-up
            t_real, t_ours = [], []
            for _ in range(repeats):
                t_real += timed(run_real, 1)
                t_ours += timed(run_ours, 1)
            mr, mo = statistics.median(t_real), statistics.median(t_ours)
            rows.append(f"| {name} | {mode} | {mr * 1e3:.2f} | {mo * 1e3:.2f} | {mo / mr:.3f} |")
    return rows


def compile_times(depths: tuple[int, ...]) -> list[str]:
    rows = []
    for n in depths:
        text = LLAMA_TEXT.replace("LlamaDecoderLayer * 2", f"LlamaDecoderLayer * {n}")
        t0 = time.process_time()
        prog = blockir.parse(text, "llama.block")
        t1 = time.process_time()
        blockir.verify(prog)
        t2 = time.process_time()
        blockir.compile(prog, "LlamaModel", dims={"D": 4096, "F": 11008, "H": 32}, device="meta")
        t3 = time.process_time()
        rows.append(f"| {n} | {(t1 - t0) * 1e3:.1f} | {(t2 - t1) * 1e3:.1f} | {(t3 - t2) * 1e3:.1f} | "
                    f"{(t3 - t0) * 1e3 / n:.2f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--depths", default="1,10,100,1000")
    ap.add_argument("--models-only", action="store_true", help="only the whole imported models")
    args = ap.parse_args()
    if args.models_only:
        print("| model | mode | HF eager ms | blockir ms | blockir/HF |\n|---|---|---|---|---|")
        for row in whole_models(args.repeats):
            print(row)
        return
    print(f"# blockir overhead — {datetime.date.today()} — {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print("\n| shape | mode | HF ms | blockir ms | blockir/HF |\n|---|---|---|---|---|")
    for row in compare("tiny", 1, 8, 64, 128, 4, 2, args.repeats) + \
            compare("medium", 4, 256, 1024, 2816, 16, 4, max(args.repeats // 3, 5)):
        print(row)
    print("\nInput check of the compiled root (same weights, one thread; CPU time per call, medians of "
          "interleaved runs of 200 calls):\n")
    print("| shape | unchecked µs | checked µs | difference µs | ratio | check alone µs |\n|---|---|---|---|---|---|")
    for row in input_check(args.repeats):
        print(row)
    print("\nCompile time (CPU time), LLaMA-style model at D=4096 (weights on the meta device):\n")
    print("| layers | parse ms | verify ms | lower ms | total ms per layer |\n|---|---|---|---|---|")
    for row in compile_times(tuple(int(d) for d in args.depths.split(","))):
        print(row)
    print("\nWhole imported models (4 layers, D=256, B=4, S=128 with right padding; HF with eager attention):\n")
    print("| model | mode | HF eager ms | blockir ms | blockir/HF |\n|---|---|---|---|---|")
    for row in whole_models(max(args.repeats // 3, 5)):
        print(row)


if __name__ == "__main__":
    main()
