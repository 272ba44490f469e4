"""Start-up cost of `blockir check` against the libraries it cannot avoid importing.

Runs, as separate processes, interleaved so that machine drift hits all of them alike:

- ``python -c pass`` (the interpreter alone),
- ``python -c "import lark, networkx"`` (the floor: the parser and graph libraries a check needs),
- ``python -m blockir check examples/llama.block`` (parser tables loaded from the package),
- building the parser tables from the grammar (what a start costs when the shipped tables do not
  match the installed lark),
- ``python -c "import torch"`` (what every command paid before torch became lazy).

Reports min and median wall time of each and the median ratio check/floor over paired runs.

    python benchmarks/startup.py [--runs 20]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
CASES = {
    "python -c pass": ([PY, "-c", "pass"], {}),
    "import lark, networkx (floor)": ([PY, "-c", "import lark, networkx"], {}),
    "blockir check llama.block": ([PY, "-m", "blockir", "check", "examples/llama.block"], {}),
    "build parser tables from grammar": ([PY, "-c", "import lark; from blockir.frontend import tables; "
                                          "lark.Lark(tables.grammar_text(), **tables.OPTIONS)"], {}),
    "import torch": ([PY, "-c", "import torch"], {}),
}


def wall(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    for argv, env in CASES.values():  # warm-up: page cache, .pyc files
        wall(argv, env)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.runs):
        for name, (argv, env) in CASES.items():
            times[name].append(wall(argv, env))
    floor = times["import lark, networkx (floor)"]
    print(f"{datetime.date.today()}  {platform.machine()}  {platform.processor() or platform.platform()}  "
          f"{os.cpu_count()} cpus  python {platform.python_version()}  {args.runs} runs each")
    print(f"{'command':<34}{'min s':>8}{'median s':>10}{'median ratio to floor':>24}")
    for name, ts in times.items():
        ratio = statistics.median(t / f for t, f in zip(ts, floor))
        print(f"{name:<34}{min(ts):>8.3f}{statistics.median(ts):>10.3f}{ratio:>24.2f}")


if __name__ == "__main__":
    main()
