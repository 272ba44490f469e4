"""Every command against lark's own parse of the same file, side by side.

Inputs: N flat blocks (360 KB and close to the 1 MiB limit), a 100,000-term
constant sum (rejected: it nests too deep) and a 100,000-layer stack. For each
input the baseline is lark's LALR parse of the text with blockir's grammar and
lark's default options (``Lark(grammar, parser="lalr").parse(text)``, a parse
tree and nothing else); each command runs in-process through
``blockir.cli.main`` with its output captured. Baseline and command alternate,
and the best of ``--repeat`` runs of each is reported with their ratio
(``diff`` reads its file twice, so its baseline is two parses).

    python benchmarks/resources.py [--repeat 3] [--markdown]
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Callable

from lark import Lark

from blockir.cli import main
from blockir.frontend.parser import grammar_text

HEAD = "dim B: batch\ndim S: seq\ndim D: model = 64\ndim F: hidden = 4 * D\n\n"
LAYER = """block Layer{i}(x: [B, S, D]) -> [B, S, D] {{
  ln_1: layernorm(D, eps=1e-5)
  attn: self_attention(heads=4)
  ln_2: layernorm(D, eps=1e-5)
  mlp: mlp(F, act=gelu)
  h = x + attn(ln_1(x))
  y = h + mlp(ln_2(h))
  return y
}}
"""
STACK = """model Model(x: [B, S, D]) -> [B, S, D] {
  layers: Layer0 * 100000
  norm: layernorm(D)
  return norm(layers(x))
}
"""
COMMANDS = ("check", "show", "keys", "cost", "liveness", "fold", "diff")


def inputs() -> dict[str, str]:
    return {
        "1,600 flat blocks (360 KB)": HEAD + "\n".join(LAYER.format(i=i) for i in range(1_600)),
        "4,600 flat blocks (1 MiB)": HEAD + "\n".join(LAYER.format(i=i) for i in range(4_600)),
        "100,000-term constant sum": "const c = " + " + ".join(["1"] * 100_000) + "\n",
        "100,000-layer stack": HEAD + LAYER.format(i=0) + "\n" + STACK,
    }


def argv(command: str, path: str) -> list[str]:
    """The command on ``path``; a file of flat blocks has no model, so every command that works on one block
    names the last (the same choice for each command, and one that the whole file was parsed to reach)."""
    flat = "model Model" not in Path(path).read_text()
    block = ["--block", "Layer0" if command == "keys" or not flat else _last_block(path)]
    if command == "check":
        return ["check", path]
    if command == "cost":
        return ["cost", path, "--dims", "B=1,S=8", *block]
    if command == "keys":
        return ["keys", path, "--block", "Layer0"]  # the stack's keys would be 100,000 tables
    return [command, path, path, *block] if command == "diff" else [command, path, *block]


def _last_block(path: str) -> str:
    text = Path(path).read_text()
    return text.rsplit("block ", 1)[1].split("(", 1)[0] if "block " in text else "Layer0"


def best(fn: Callable[[], object], repeat: int, other: Callable[[], object]) -> tuple[float, float]:
    """Best time of ``fn`` and of ``other``, alternating so that both see the same machine load."""
    a, b = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        other()
        b.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fn()
        a.append(time.perf_counter() - t0)
    return min(a), min(b)


def quiet(args: list[str]) -> int:
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return main(args)


def measure(repeat: int) -> list[tuple[str, str, int, float, float]]:
    lark = Lark(grammar_text(), parser="lalr")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in inputs().items():
            path = str(Path(tmp) / "input.block")
            Path(path).write_text(text)

            def parse() -> None:
                try:
                    lark.parse(text)
                except Exception:  # noqa: BLE001  the sum nests too deep for blockir only; lark parses it
                    pass
            for command in COMMANDS:
                if name.startswith("100,000-term") and command != "check":
                    continue  # every command rejects it the same way
                times = 2 if command == "diff" else 1
                code = quiet(argv(command, path))
                ours, base = best(lambda: quiet(argv(command, path)), repeat,
                                  lambda: [parse() for _ in range(times)])
                rows.append((name, command, code, ours, base))
    return rows


def main_() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    rows = measure(args.repeat)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    if args.markdown:
        print("| input | command | exit | blockir s | lark parse s | ratio |\n|---|---|---|---|---|---|")
    for name, command, code, ours, base in rows:
        if args.markdown:
            print(f"| {name} | {command} | {code} | {ours:.2f} | {base:.2f} | {ours / base:.2f}× |")
        else:
            print(f"{name:<28} {command:<9} exit {code}  {ours:7.2f} s  lark {base:7.2f} s  {ours / base:5.2f}×")


if __name__ == "__main__":
    main_()
