"""Bytes autograd keeps for backward at one residual boundary: eager HF vs the fused op.

Every tensor autograd saves passes through ``saved_tensors_hooks``; tensors
sharing a storage are counted once. The table gives the total and the same
amount as a multiple of one ``[B, S, D]`` tensor in the run's dtype.

    python benchmarks/saved_bytes.py [--batch 4 --seq 512 --width 1024 --device cpu]
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import Tensor
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from blockir.lower.fused import add_layer_norm, add_rms_norm


def saved_bytes(fn: Callable[[], object]) -> tuple[int, int]:
    """``(bytes, full_width_tensors)`` saved for backward while ``fn`` runs, one count per storage."""
    storages: dict[int, tuple[int, bool]] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = (storage.nbytes(), t.dim() >= 2 and t.shape[-1] > 1)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(n for n, _ in storages.values()), sum(full for _, full in storages.values())


def boundaries(shape: tuple[int, int, int], dtype: torch.dtype, device: str) -> dict[str, Callable[[], object]]:
    width = shape[-1]
    branch = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    residual = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    hf_norm = LlamaRMSNorm(width, eps=1e-6).to(device=device, dtype=dtype)
    weight = torch.nn.Parameter(torch.ones(width, dtype=dtype, device=device))
    bias = torch.nn.Parameter(torch.zeros(width, dtype=dtype, device=device))
    layer_scale = torch.nn.Parameter(torch.full((width,), 0.1, dtype=dtype, device=device))
    return {
        "HF eager: residual + branch, LlamaRMSNorm": lambda: hf_norm(residual + branch),
        "fused add_rms_norm": lambda: add_rms_norm(branch, residual, weight, eps=1e-6),
        "fused add_rms_norm, dropout p=0.1": lambda: add_rms_norm(
            branch, residual, weight, eps=1e-6, p=0.1, training=True, dropout_key=7),
        "fused add_layer_norm": lambda: add_layer_norm(branch, residual, weight, bias),
        "fused add_rms_norm, learned LayerScale": lambda: add_rms_norm(
            branch, residual, weight, eps=1e-6, branch_scale=layer_scale),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    shape = (args.batch, args.seq, args.width)

    print(f"saved for backward at one residual boundary, [B,S,D] = {list(shape)}, device {args.device}")
    header = f"{'boundary':<42} {'dtype':<9} {'bytes':>12} {'x [B,S,D]':>10} {'full-width':>10}"
    print(header)
    print("-" * len(header))
    for dtype in (torch.float32, torch.bfloat16):
        one = torch.Size(shape).numel() * dtype.itemsize
        for name, fn in boundaries(shape, dtype, args.device).items():
            nbytes, full = saved_bytes(fn)
            print(f"{name:<42} {str(dtype).removeprefix('torch.'):<9} {nbytes:>12,} {nbytes / one:>10.3f} {full:>10}")
    print("\nfull-width: saved storages with a channel axis ([B,S,D]-like); the rest are [D] parameters, "
          "[B*S] fp32 row statistics and the dropout key.")


if __name__ == "__main__":
    main()
