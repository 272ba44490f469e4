"""The training session of `blockir run`: a byte-level language model on real text, resumable bit for bit.

A :class:`Trainer` owns every piece of state that decides the next step: parameters, AdamW
moments, the warmup schedule's counter, the batch sampler's generator and torch's generator
(which draws each forward's dropout and stochastic-depth seed). Each step runs with torch's
generator swapped in from the trainer and saved back afterwards, so two trainers can step in
turn (``compare``) and a checkpoint holds the whole stream: N steps, save, resume, N more steps
give the same losses and parameters, bit for bit, as 2N steps in one run.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from blockir.analyses.hypersphere import on_sphere
from blockir.analyses.sites import residual_sites
from blockir.analyses.sizes import Sizes
from blockir.lifecycle.calibrate import NormState, norm_states
from blockir.lower.layers.add_norm import AddNormReference
from blockir.lower.compile import compile as compile_block
from blockir.lifecycle.corpus import Corpus, check_windows, fixed_starts, load_corpus, sample_starts, windows
from blockir.lower.hypersphere import parameter_norm_error, project, project_after_step, row_norm_error
from blockir.lower.layers.numerics import batch_slice
from blockir.lifecycle.lm import ByteLM, layout, needs_final_norm
from blockir.lifecycle.moments import NormDrift, SiteMoments, norm_drift, site_moments
from blockir.lifecycle.ngpt_scales import ScaleRange, ngpt_scales, scale_range
from blockir.lifecycle.placement import autocast, compile_forward, run_device
from blockir.lifecycle.token_lm import TokenLM, takes_tokens, token_layout
from blockir.lifecycle.telemetry import (MethodStats, ScoreStats, SiteStats, method_telemetry, score_telemetry,
                                       telemetry)
from blockir.lower.trace import trace
from blockir.reports.budget import budget_diagnostics
from blockir.diagnostics import BlockError
from blockir.ir.decls import ExternDecl, InstanceDecl
from blockir.ir.program import Block, Program


@dataclass(frozen=True)
class RunConfig:
    steps: int = 1
    seed: int = 0
    lr: float = 3e-3
    warmup: int = 0  # linear warmup steps; the rate is constant afterwards, so a resumed run needs no horizon
    batch: int | None = None  # windows per step (default: the batch dim's size)
    dims: dict[str, int] = field(default_factory=dict)
    data: str | None = None  # a text file or directory; None: the standard library's source
    eval_every: int = 0  # validation loss and telemetry every N steps (0: at the end only)
    eval_batches: int = 2
    backend: str = "fx"
    accum: int = 1  # micro-batches of `batch` windows per optimizer step (gradient accumulation)
    device: str | None = None  # where the model and batches live (None: CPU)
    dtype: str = "fp32"  # "bf16": fp32 master weights, forward and backward under bf16 autocast
    compile: str | None = None  # a torch.compile backend for the training forward (None: eager)
    # applied to the compiled block before training: data-dependent initialisation (Admin)
    init: Callable[[nn.Module], object] | None = None


@dataclass(frozen=True)
class Snapshot:
    step: int
    val_loss: float
    sites: tuple[SiteStats, ...]
    sphere: tuple[float, float] | None = None  # nGPT: max |‖h‖ − 1| over hidden rows, and over projected vectors
    methods: tuple[MethodStats, ...] = ()  # branch gates and DyT applications, when the model has any
    scores: tuple[ScoreStats, ...] = ()  # RealFormer: each carried score state
    norms: tuple[NormState, ...] = ()  # batch-coupled norms: PRepBN's step and gamma, running-stat age
    moments: tuple[SiteMoments, ...] = ()  # the second-moment ledger of every residual update
    drift: tuple[NormDrift, ...] = ()  # RMS² / (Var + ε) at the input of every norm
    scales: tuple[ScaleRange, ...] = ()  # nGPT: the applied eigen rates, s_qk and s_z


@dataclass(frozen=True)
class RunReport:
    losses: tuple[float, ...]  # train loss of every step of this run
    snapshots: tuple[Snapshot, ...]  # validation and telemetry, at every evaluation
    rows: int  # rows the telemetry quantiles are taken over
    tokens_per_s: float
    first_step: int  # the step count this run started from (0, or the resumed checkpoint's)

    @property
    def sites(self) -> tuple[SiteStats, ...]:
        return self.snapshots[-1].sites if self.snapshots else ()


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
        if isinstance(d, ExternDecl) and d.contract is not None:
            out[prefix + d.name] = AddNormReference(d, sizes)  # what the contract states it computes
        elif isinstance(d, ExternDecl):
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


MAX_SEED = 2 ** 63  # torch's generators take a 64-bit seed
BACKENDS = ("fx", "fused")
DTYPES = ("fp32", "bf16")


def _count(v: object, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def config_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """(field, what is wrong) for every setting of ``cfg`` a run cannot honour; empty when it can."""
    out = []
    for name, least in (("steps", 0), ("warmup", 0), ("eval_every", 0), ("eval_batches", 1), ("accum", 1)):
        if not _count(getattr(cfg, name), least):
            out.append((name, f"must be an integer of at least {least}, got {getattr(cfg, name)!r}"))
    if not _count(cfg.seed, 0) or cfg.seed >= MAX_SEED:
        out.append(("seed", f"must be an integer in [0, 2**63), got {cfg.seed!r}"))
    if isinstance(cfg.lr, bool) or not isinstance(cfg.lr, (int, float)) or not math.isfinite(cfg.lr) or cfg.lr <= 0:
        out.append(("lr", f"must be a finite positive learning rate, got {cfg.lr!r}"))
    if cfg.batch is not None and not _count(cfg.batch, 1):
        out.append(("batch", f"must be at least 1 window a step, got {cfg.batch!r}"))
    if not isinstance(cfg.dims, dict) or not all(isinstance(k, str) and _count(v, 1) for k, v in cfg.dims.items()):
        out.append(("dims", f"must map dim names to positive integers, got {cfg.dims!r:.80}"))
    if cfg.backend not in BACKENDS:
        out.append(("backend", f"must be one of {', '.join(BACKENDS)}, got {cfg.backend!r:.40}"))
    if cfg.dtype not in DTYPES:
        out.append(("dtype", f"must be one of {', '.join(DTYPES)}, got {cfg.dtype!r:.40}"))
    if cfg.compile is not None and (not isinstance(cfg.compile, str) or not cfg.compile):
        out.append(("compile", f"must name a torch.compile backend, got {cfg.compile!r:.40}"))
    return out


def run_budget(program: Program, block: Block, cfg: RunConfig) -> None:
    """Refuse, before anything is allocated, a run whose step would not fit (the batch counted as --batch)."""
    dims = dict(cfg.dims)
    if cfg.batch is not None:
        dims[block.params[0].type.axes[0].name] = cfg.batch
    wrong = budget_diagnostics(program, block.name, dims)
    if wrong:
        raise BlockError(wrong)


def batch_size(program: Program, block: Block, cfg: RunConfig) -> int:
    if cfg.batch is not None:
        return cfg.batch
    return Sizes.of(program, cfg.dims).dim(block.params[0].type.axes[0].name)


def build_model(program: Program, block: Block, cfg: RunConfig,
                pretrained: nn.Module | None = None) -> tuple[ByteLM | TokenLM, torch.Tensor]:
    """The language model of ``block`` as initialised from ``cfg.seed``, and torch's generator state after it.

    A model that takes token ids is its own language model (:class:`TokenLM`), compiled here or,
    as ``pretrained``, already compiled with its weights loaded; any other block gets ByteLM's
    embedding, final norm and head around it.
    """
    sizes = Sizes.of(program, cfg.dims)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        if takes_tokens(block):
            shape = token_layout(program, block, sizes)
            core = pretrained if pretrained is not None else compile_block(
                program, block.name, cfg.backend, dims=cfg.dims, bind=stand_ins(program, block, cfg.dims),
                seed=cfg.seed)
            if cfg.init is not None:
                cfg.init(core)
            return TokenLM(core, shape, TokenLM.is_causal(program)), torch.get_rng_state()
        core = compile_block(program, block.name, cfg.backend, dims=cfg.dims,
                             bind=stand_ins(program, block, cfg.dims), seed=cfg.seed)
        if cfg.init is not None:
            cfg.init(core)
        sphere = on_sphere(program, block.name)
        model = ByteLM(core, layout(program, block, sizes), needs_final_norm(program, block), sphere)
        if sphere:
            project(core, model.sphere_tables())  # nGPT starts on the sphere, not only after the first step
        return model, torch.get_rng_state()


class Trainer:
    """One model, its optimizer and schedule, its data stream and its randomness."""

    def __init__(self, program: Program, block: Block, cfg: RunConfig, corpus: Corpus,
                 pretrained: nn.Module | None = None, where: dict[str, str] | None = None) -> None:
        """``pretrained``: the compiled ``block`` with its weights loaded (a model folder's), trained as it is;
        ``where``: the option each of device and compile came from, to locate their diagnostics."""
        self.program, self.block, self.cfg, self.corpus = program, block, cfg, corpus
        where = where or {}
        self.device = run_device(cfg.device, where.get("device", "RunConfig(device=…)"))
        sizes = Sizes.of(program, cfg.dims)
        self.shape = token_layout(program, block, sizes) if takes_tokens(block) else layout(program, block, sizes)
        self.batch = batch_size(program, block, cfg)
        run_budget(program, block, cfg)
        check_windows(corpus, self.shape.window)
        self.model, self.rng = build_model(program, block, cfg, pretrained)
        self.model.to(self.device)
        compile_forward(self.model, cfg.compile, where.get("compile", "RunConfig(compile=…)"))
        self.batches = torch.Generator().manual_seed(cfg.seed)
        self.sphere = self.model.logit_scale is not None
        # nGPT trains without weight decay: the projection already bounds every matrix
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.0 if self.sphere else 0.01)
        if self.sphere:
            project_after_step(self.optimizer, self.model.core, self.model.sphere_tables())
        warmup = max(cfg.warmup, 0)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
        self.step_count = 0

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def next_batch(self) -> torch.Tensor:
        """The windows of one optimizer step: ``accum`` micro-batches of ``batch`` windows, drawn at once."""
        starts = sample_starts(self.corpus.train, self.batch * self.cfg.accum, self.shape.window, self.batches)
        return windows(self.corpus.train, starts, self.shape.window)

    def train_step(self, batch: torch.Tensor) -> float:
        """One optimizer step over ``batch``, in ``accum`` micro-batches: each micro-batch's mean loss is
        scaled by its share of the windows, so loss and gradients are those of the whole batch at once."""
        batch = batch.to(self.device)
        total = batch.shape[0]
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.rng)
            self.model.train()
            self.optimizer.zero_grad(set_to_none=True)
            loss = torch.zeros((), device=self.device)
            micros = batch.split(self.batch)
            start = torch.get_rng_state()
            for k, micro in enumerate(micros):
                # every micro-batch draws the step's one dropout seed and keys its masks by its rows of the whole
                # batch, so the step drops exactly what one forward over the whole batch drops
                torch.set_rng_state(start)
                with batch_slice(k, len(micros)), autocast(self.cfg.dtype, self.device):
                    part = self.model(micro) * (micro.shape[0] / total)
                part.backward()
                loss += part.detach()
            self.optimizer.step()
            self.schedule.step()
            self.rng = torch.get_rng_state()
        self.step_count += 1
        return loss.item()

    def _val_windows(self) -> torch.Tensor:
        n = self.batch * self.cfg.eval_batches
        return windows(self.corpus.val, fixed_starts(self.corpus.val, n, self.shape.window), self.shape.window)

    @torch.no_grad()
    def evaluate(self) -> Snapshot:
        """Validation loss over fixed windows, and telemetry on the first batch of them (eval mode: no dropout)."""
        self.model.eval()
        try:
            val = self._val_windows().to(self.device)
            losses = [self.model(chunk).item() for chunk in val.split(self.batch)]
            inputs, _ = self.model.split(val[:self.batch])
            out, values = trace(self.model.core, *inputs, **self.model.context())
            sizes = Sizes.of(self.program, self.cfg.dims)
            sites = telemetry(self.program, self.block, values, sizes)
            methods = method_telemetry(self.program, self.block, self.model.core, values, sizes)
            scores = score_telemetry(self.program, self.block, values, sizes)
            sphere, scales = None, []
            if self.sphere:
                hidden = [values[s.shortcut] for s in residual_sites(self.program, self.block, sizes)
                          if s.shortcut in values] + [out]
                sphere = (row_norm_error(hidden), parameter_norm_error(self.model.core, self.model.sphere_tables()))
                scales = ngpt_scales(self.program, self.block, self.model.core, sizes)
                scales.append(scale_range("logits", "s_z", "logit_scale", self.model.logit_scale,
                                          self.model.shape.width ** 0.5))
        finally:
            self.model.train()
        return Snapshot(self.step_count, sum(losses) / len(losses), tuple(sites), sphere, tuple(methods),
                        tuple(scores), tuple(norm_states(self.model.core)),
                        tuple(site_moments(self.program, self.block, values, sizes)),
                        tuple(norm_drift(self.program, self.block, values, sizes)), tuple(scales))

    def rows(self) -> int:
        return self.batch * self.shape.lengths[0]

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict(), "step": self.step_count,
                "rng": {"torch": self.rng, "batches": self.batches.get_state()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"], strict=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.step_count = int(state["step"])
        self.rng = state["rng"]["torch"].clone()
        self.batches.set_state(state["rng"]["batches"])


def evaluation_due(step: int, last: int, every: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


def train(trainer: Trainer, steps: int, log: Callable[[str], None] = lambda _: None,
          progress: Callable[[int, float], None] | None = None,
          after_step: Callable[[Trainer], None] | None = None) -> RunReport:
    """Run ``steps`` steps from wherever ``trainer`` stands, evaluating as its config asks; ``after_step``
    sees the trainer after each step, with the gradients of that step still on its parameters."""
    first = trainer.step_count
    last = first + steps
    losses: list[float] = []
    snapshots: list[Snapshot] = []
    tokens = trainer.batch * trainer.cfg.accum * trainer.shape.lengths[-1]
    elapsed = 0.0
    for _ in range(steps):
        batch = trainer.next_batch()
        t0 = time.perf_counter()
        loss = trainer.train_step(batch)
        elapsed += time.perf_counter() - t0
        losses.append(loss)
        step = trainer.step_count
        if after_step is not None:
            after_step(trainer)
        if progress is not None:
            progress(step, loss)
        else:
            log(f"step {step}/{last}  loss {loss:.4f}  {tokens * len(losses) / max(elapsed, 1e-9):,.0f} tok/s")
        if not torch.isfinite(torch.tensor(loss)):
            log(f"step {step}: loss is not finite; stopping")
            break
        if evaluation_due(step, last, trainer.cfg.eval_every):
            snapshots.append(trainer.evaluate())
            log(f"step {step}: validation loss {snapshots[-1].val_loss:.4f}")
    if not snapshots:  # a run that stopped early still reports where it stands
        snapshots.append(trainer.evaluate())
    return RunReport(tuple(losses), tuple(snapshots), trainer.rows(), tokens * len(losses) / max(elapsed, 1e-9), first)


def run_session(program: Program, block: Block, cfg: RunConfig, log: Callable[[str], None] = lambda _: None,
                corpus: Corpus | None = None) -> RunReport:
    """Build the byte-level model around ``block`` and train ``cfg.steps`` steps on ``cfg.data``."""
    trainer = Trainer(program, block, cfg, corpus if corpus is not None else load_corpus(cfg.data))
    return train(trainer, cfg.steps, log)
