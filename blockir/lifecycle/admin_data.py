"""Admin's profile on a data file (``blockir recipe admin FILE --data PATH --tokens N``): the profile batch is
the file's first bytes, fed through the byte-level language model ``blockir run`` trains, and the data's
identity (its sha256) and token budget are part of the initialisation record.

The paper profiles on no more than 8,192 tokens; ``tokens`` is that budget. The file must hold at least
``tokens`` bytes (one byte is one token, as for ``blockir run``), and the profile, ``B`` windows of the
model's window length, must not read more than ``tokens`` of them (both E0714).
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import torch

from blockir.diagnostics import BlockError, Span, argument_error, error
from blockir.ir.program import Program
from blockir.lifecycle.admin import AdminInit, apply
from blockir.lifecycle.corpus import load_corpus
from blockir.lifecycle.session import RunConfig, Trainer
from blockir.lifecycle.token_lm import takes_tokens
from blockir.passes.recipes.admin import Profile
from blockir.passes.recipes.base import RecipeResult


@dataclass(frozen=True)
class DataProfile:
    """What the profile read and measured: the data's identity, the budget, and the omegas it set."""

    data: str
    sha256: str  # of the whole data file
    data_tokens: int  # bytes the file holds
    budget: int  # --tokens
    tokens: int  # bytes the profile batch read: batch x window
    batch: int
    window: int
    seed: int
    model: str
    profile: Profile
    omega: dict[str, float]  # parameter path -> the value written into every channel
    checkpoint: dict[str, str] | None = None  # where the profiled initialisation was saved, and its model.pt hash

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        out["profile"] = asdict(self.profile)
        return out


def read_data(path: str | Path, budget: int) -> bytes:
    """The bytes of the data file; refused when it holds fewer than ``budget`` tokens."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise BlockError([argument_error("recipe", "data", f"cannot read {path}: {exc.strerror or exc}",
                                         "give a text file to profile on")]) from None
    if len(raw) < budget:
        raise BlockError([error("E0714", f"the profile data {path} holds {len(raw):,} tokens (bytes), fewer than "
                                f"the token budget of {budget:,}", Span(str(path), 1, 1),
                                hint="give a larger data file, or a smaller --tokens")])
    return raw


def profile_on_data(program: Program, block_name: str, data: str | Path, tokens: int, *,
                    dims: Mapping[str, int], seed: int = 0) -> tuple[RecipeResult, DataProfile, Trainer]:
    """Admin on ``block_name`` with omega profiled on the first bytes of ``data``, in the byte-level language
    model around the model that stacks the block, compiled from ``seed`` at ``dims`` (every dim sized).

    The trainer returned is the run ``blockir run --seed`` would start on ``data``, its omegas set by the
    profile: a checkpoint of it (``blockir.lifecycle.checkpoint.save``) is the profiled initialisation."""
    raw = read_data(data, tokens)
    result = apply(program, block_name)
    init = result.init
    assert isinstance(init, AdminInit)
    target = result.program.block(init.target)
    # the recipe's program is printed and parsed back: the user's file locates the diagnostics
    at = program.block(target.name).params[0].span
    if takes_tokens(target):
        raise BlockError([error("E0715", f"'{target.name}' reads token ids, so the profile's x_0 would be ids, not "
                                "the stream the first sublayer reads", at,
                                hint="profile the model without its embedding: give --block a layer stacked by a "
                                     "model whose input is the [B, S, D] stream")])
    if Path(data).is_dir():
        raise BlockError([argument_error("recipe", "data", f"{data} is a directory; the profile's identity is one "
                                         "file's sha256", "give one text file")])
    trainer = Trainer(result.program, target, RunConfig(dims=dict(dims), seed=seed), load_corpus(str(data), "recipe"))
    model = trainer.model
    batch, window = trainer.batch, model.shape.window
    if batch * window > tokens:
        raise BlockError([error("E0714", f"the profile batch of '{target.name}' is {batch} windows of {window} "
                                f"bytes, {batch * window:,} tokens, more than the token budget of {tokens:,}",
                                at, hint="give smaller batch or sequence sizes with --dims, or a larger --tokens")])
    rows = torch.frombuffer(bytearray(raw[:batch * window]), dtype=torch.uint8).long().view(batch, window)
    with torch.no_grad():
        inputs, _ = model.split(rows)
    profiled = AdminInit(result.program, target.name, init.sites, inputs, {}, seed, model.context())
    profiled(model.core)
    assert profiled.profile is not None
    omega = {s.omega: w for s, w in zip(profiled.sites, profiled.profile.omega)}
    record = DataProfile(str(data), hashlib.sha256(raw).hexdigest(), len(raw), tokens, batch * window, batch,
                         window, seed, target.name, profiled.profile, omega)
    return replace(result, init=profiled), record, trainer
