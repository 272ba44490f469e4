"""Throughput of the fused residual boundary (add + norm) against the unfused graph.

On a GPU: measures the device's copy bandwidth, then for every (dtype, M, D)
times the fused op, eager PyTorch and ``torch.compile`` of the unfused graph
(and Liger-Kernel's fused add-RMSNorm when it is installed), forward alone and
forward + backward. Achieved GB/s counts each operand read once and each
result written once; "% copy" relates that to the measured copy bandwidth;
"x eager" etc. are the other implementation's time divided by the fused time.
Every configuration is checked for correctness before it is timed.

``--dry-run`` runs the same code on CPU with tiny shapes through the reference
path (and ``aot_eager`` instead of Inductor), so the script is known to work.

    python benchmarks/fused_norm.py                 # GPU
    python benchmarks/fused_norm.py --dry-run       # CPU, seconds
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from blockir.reports.cost import fused_boundary_bytes
from blockir.norms.layernorm import layer_norm
from blockir.norms.rmsnorm import rms_norm
from blockir.lower.fused import add_layer_norm, add_rms_norm

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
EPS = 1e-6


@dataclass
class Problem:
    family: str
    rows: int
    width: int
    dtype: torch.dtype
    device: str

    def make(self, seed: int = 0) -> dict[str, Tensor]:
        g = torch.Generator(device=self.device).manual_seed(seed)

        def rnd(*shape: int, scale: float = 1.0, shift: float = 0.0) -> Tensor:
            t = torch.randn(shape, generator=g, device=self.device, dtype=torch.float32) * scale + shift
            return t.to(self.dtype).requires_grad_(True)

        inputs = {"branch": rnd(self.rows, self.width), "residual": rnd(self.rows, self.width, scale=2.0),
                  "weight": rnd(self.width, scale=0.1, shift=1.0)}
        if self.family == "layernorm":
            inputs["bias"] = rnd(self.width, scale=0.1)
        return inputs

    def traffic(self, backward: bool) -> int:
        """Bytes a perfect kernel moves: each operand read once, each result written once (the ledger's count)."""
        return fused_boundary_bytes(self.family, self.rows, self.width, self.dtype.itemsize, backward)


def fused(p: Problem) -> Callable[..., tuple[Tensor, Tensor]]:
    if p.family == "layernorm":
        return lambda branch, residual, weight, bias: add_layer_norm(branch, residual, weight, bias, eps=EPS)
    return lambda branch, residual, weight: add_rms_norm(branch, residual, weight, eps=EPS)


def unfused(p: Problem) -> Callable[..., tuple[Tensor, Tensor]]:
    def graph(branch: Tensor, residual: Tensor, weight: Tensor, bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
        h = residual + branch
        if p.family == "layernorm":
            return layer_norm(h, weight, bias, EPS), h
        return rms_norm(h, weight, EPS), h

    return graph


def liger(p: Problem) -> Callable[..., tuple[Tensor, Tensor]] | None:
    if p.family != "rmsnorm" or p.device != "cuda":
        return None
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    except ImportError:
        return None
    return lambda branch, residual, weight: LigerFusedAddRMSNormFunction.apply(
        branch, residual, weight, EPS, 0.0, "llama", False)


def step(fn: Callable[..., tuple[Tensor, Tensor]], inputs: dict[str, Tensor], grads: tuple[Tensor, Tensor] | None):
    """One forward (and backward, when output gradients are given) as a closure."""
    args = list(inputs.values())
    if grads is None:
        def run() -> None:
            with torch.no_grad():
                fn(*args)
    else:
        def run() -> None:
            torch.autograd.backward(fn(*args), grads)
    return run


def timed(run: Callable[[], None], inputs: dict[str, Tensor], device: str, reps: int) -> float:
    """Median seconds per call."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(run, grad_to_none=list(inputs.values()), return_mode="median") / 1e3
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
        for t in inputs.values():
            t.grad = None
    return statistics.median(samples)


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), {}, device, reps=5)
    return 2 * nbytes / seconds


def check(p: Problem, impls: dict[str, Callable], inputs: dict[str, Tensor], grads: tuple[Tensor, Tensor]) -> None:
    """Every implementation's outputs and input gradients against an fp32 run of the unfused graph."""
    ref_inputs = {k: v.detach().float().requires_grad_(True) for k, v in inputs.items()}
    ref_out = unfused(p)(*ref_inputs.values())
    torch.autograd.backward(ref_out, tuple(g.float() for g in grads))
    expected = [o.detach() for o in ref_out] + [t.grad for t in ref_inputs.values()]
    tol = 3e-2 if p.dtype == torch.bfloat16 else 1e-4
    for name, fn in impls.items():
        fresh = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
        out = fn(*fresh.values())
        torch.autograd.backward(out, grads)
        got = [o.detach() for o in out] + [t.grad for t in fresh.values()]
        for what, g, e in zip(["normalized", "residual_out", *fresh], got, expected):
            scale = e.abs().max().item()
            err = (g.float() - e).abs().max().item()
            if err > tol * max(scale, 1.0):
                raise SystemExit(f"{name}: {what} differs from the fp32 reference by {err:.3e} (scale {scale:.3e})")


def header(args: argparse.Namespace, device: str) -> None:
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    print(f"# date     {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}")
    print(f"# device   {name}")
    print(f"# command  {' '.join([sys.executable, *sys.argv])}")
    versions = f"torch {torch.__version__}"
    try:
        import triton

        versions += f", triton {triton.__version__}"
    except ImportError:
        pass
    print(f"# versions {versions}; family {args.family}; GB = 1e9 bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU through the reference path")
    parser.add_argument("--family", choices=["rmsnorm", "layernorm"], default="rmsnorm")
    parser.add_argument("--rows", type=int, nargs="+", help="M values (default 4096 16384)")
    parser.add_argument("--widths", type=int, nargs="+", help="D values (default 2048 4096 8192)")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--reps", type=int, default=5, help="timed calls per measurement on CPU")
    args = parser.parse_args()

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark needs a GPU (use --dry-run to check the script on CPU)")
    rows = args.rows or ([64] if args.dry_run else [4096, 16384])
    widths = args.widths or ([128, 320] if args.dry_run else [2048, 4096, 8192])
    backend = "aot_eager" if args.dry_run else "inductor"

    # every (dtype, M, D) compiles the unfused graph afresh; keep Dynamo from falling back to eager
    torch._dynamo.config.recompile_limit = 4 * len(rows) * len(widths) * len(args.dtypes)
    header(args, device)
    bandwidth = copy_bandwidth(device, (8 << 20) if args.dry_run else (2 << 30))
    print(f"# copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write)\n")
    columns = f"{'dtype':<5} {'M':>6} {'D':>5} {'pass':<8} {'fused us':>9} {'GB/s':>7} {'% copy':>7} " \
              f"{'x eager':>8} {'x compile':>9} {'x liger':>8}"
    print(columns)
    print("-" * len(columns))
    for dtype_name in args.dtypes:
        for m in rows:
            for d in widths:
                p = Problem(args.family, m, d, DTYPES[dtype_name], device)
                inputs = p.make()
                grads = tuple(torch.randn(m, d, device=device, dtype=p.dtype) for _ in range(2))
                impls = {"fused": fused(p), "eager": unfused(p),
                         "compile": torch.compile(unfused(p), backend=backend, dynamic=False)}
                if (liger_fn := liger(p)) is not None:
                    impls["liger"] = liger_fn
                check(p, impls, inputs, grads)
                for label, g in (("fwd", None), ("fwd+bwd", grads)):
                    seconds = {name: timed(step(fn, inputs, g), inputs, device, args.reps)
                               for name, fn in impls.items()}
                    t = seconds["fused"]
                    gbps = p.traffic(g is not None) / t / 1e9
                    ratio = {name: f"{seconds[name] / t:.2f}" if name in seconds else "-"
                             for name in ("eager", "compile", "liger")}
                    print(f"{dtype_name:<5} {m:>6} {d:>5} {label:<8} {t * 1e6:>9.1f} {gbps:>7.1f} "
                          f"{100 * gbps * 1e9 / bandwidth:>6.1f}% {ratio['eager']:>8} {ratio['compile']:>9} "
                          f"{ratio['liger']:>8}")
    if args.dry_run:
        print("\n# dry run: CPU reference path, numbers say nothing about GPU performance")


if __name__ == "__main__":
    main()
