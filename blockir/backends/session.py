"""A short deterministic training run on random data, for smoke tests and telemetry."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from blockir.backends.compile import compile as compile_block
from blockir.analyses.sizes import Sizes
from blockir.backends.telemetry import SiteStats, telemetry
from blockir.backends.trace import trace
from blockir.ir.decls import ExternDecl, InstanceDecl
from blockir.ir.program import Block, Program


@dataclass(frozen=True)
class RunConfig:
    steps: int = 1
    seed: int = 0
    lr: float = 1e-3
    dims: dict[str, int] = field(default_factory=dict)
    # applied to the compiled module before training: data-dependent initialisation (Admin)
    init: Callable[[nn.Module], object] | None = None


@dataclass(frozen=True)
class RunReport:
    losses: tuple[float, ...]
    sites: tuple[SiteStats, ...]
    rows: int


class StandIn(nn.Module):
    """Replaces an extern in runs without real modules: a linear map of the first input."""

    def __init__(self, width_in: int, width_out: int):
        super().__init__()
        self.proj = nn.Linear(width_in, width_out)

    def forward(self, x: torch.Tensor, *rest: torch.Tensor, **ctx: object) -> torch.Tensor:
        return self.proj(x)


def stand_ins(program: Program, block: Block, dims: dict[str, int], prefix: str = "") -> dict[str, nn.Module]:
    """A stand-in for every extern reachable from ``block``, keyed by its full path."""
    sizes = Sizes.of(program, dims)
    out: dict[str, nn.Module] = {}
    for d in block.decls:
        if isinstance(d, ExternDecl):
            out[prefix + d.name] = StandIn(sizes.dim(d.params[0].type.axes[-1].name), sizes.dim(d.result.axes[-1].name))
        elif isinstance(d, InstanceDecl):
            sub = program.block(d.block)
            paths = [f"{prefix}{d.name}."] if d.count is None else \
                [f"{prefix}{d.name}.{i}." for i in range(int(sizes.value(d.count)))]
            for p in paths:
                out.update(stand_ins(program, sub, dims, p))
    return out


def random_inputs(program: Program, block: Block, dims: dict[str, int], gen: torch.Generator) -> list[torch.Tensor]:
    sizes = Sizes.of(program, dims)
    return [torch.randn(*(sizes.dim(a.name) for a in p.type.axes), generator=gen) for p in block.params]


def run_session(program: Program, block: Block, cfg: RunConfig, log: Callable[[str], None] = lambda _: None) -> RunReport:
    """Compile with stand-ins for externs, train ``cfg.steps`` AdamW steps on a random regression target."""
    bind = stand_ins(program, block, cfg.dims)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = compile_block(program, block.name, dims=cfg.dims, bind=bind, seed=cfg.seed)
        if cfg.init is not None:
            cfg.init(model)
        gen = torch.Generator().manual_seed(cfg.seed)
        inputs = random_inputs(program, block, cfg.dims, gen)
        target = torch.randn(model(*inputs).shape, generator=gen)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        losses = []
        shape = "x".join(str(s) for s in inputs[0].shape)
        log(f"run {block.name}: inputs {shape}, {sum(p.numel() for p in model.parameters())} parameters, "
            f"{cfg.steps} step{'s' if cfg.steps != 1 else ''}")
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(*inputs), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if not torch.isfinite(loss):
                log(f"step {step + 1}: loss is not finite; stopping")
                break
            log(f"step {step + 1}/{cfg.steps}  loss {losses[-1]:.6f}  ({time.perf_counter() - t0:.2f} s)")
        _, values = trace(model, *inputs)
    sites = telemetry(program, block, values, Sizes.of(program, cfg.dims))
    return RunReport(tuple(losses), tuple(sites), inputs[0].numel() // inputs[0].shape[-1])
