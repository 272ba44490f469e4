"""Gradient accumulation draws the masks of the unaccumulated step: each micro-batch takes the step's one
dropout seed and keys its masks by its rows of the whole batch, so ``--accum K`` trains as one batch."""
from __future__ import annotations

import pytest
import torch

import blockir
from blockir.lifecycle.corpus import load_corpus
from blockir.lifecycle.session import RunConfig, Trainer
from blockir.lower.layers.numerics import batch_slice
from conftest import ROOT

DROPOUT = """dim B: batch
dim S: seq
dim D: model = 8
block T(x: [B, S, D]) -> [B, S, D] {
  proj: linear(D, D)
  y = x + dropout(proj(x), p=0.5)
  return y
}
"""


def test_a_micro_batch_draws_its_rows_of_the_whole_batchs_mask() -> None:
    m = blockir.compile(blockir.parse(DROPOUT, "d.block"), "T", seed=0).train()
    x = torch.ones(4, 3, 8)
    state = torch.get_rng_state()
    whole = m(x)
    parts = []
    for k in range(2):
        torch.set_rng_state(state)
        with batch_slice(k, 2):
            parts.append(m(x[2 * k:2 * k + 2]))
    assert torch.equal(torch.cat(parts) == x, whole == x)  # the same values dropped (kept ones are rounded alike)
    assert not torch.equal(parts[0], parts[1])  # the halves really differ: the rows are keyed, not repeated


def _step(accum: int) -> tuple[float, dict[str, torch.Tensor]]:
    program = blockir.load(ROOT / "examples" / "bert.block")
    trainer = Trainer(program, program.block("BertLayer"), RunConfig(batch=4 // accum, accum=accum, dims={"S": 16}),
                      load_corpus(None))
    loss = trainer.train_step(trainer.next_batch())
    return loss, {n: p.grad.clone() for n, p in trainer.model.named_parameters()}


def test_accum_trains_as_one_batch_with_dropout() -> None:
    """BERT's example drops on every branch: two micro-batches of 2 windows give the loss and every gradient
    of one batch of 4 (the same masks; only the sum's rounding differs)."""
    whole, grads = _step(1)
    split, accumulated = _step(2)
    assert split == pytest.approx(whole, rel=1e-6)
    for name, g in grads.items():
        assert (accumulated[name] - g).norm() <= 1e-6 * g.norm() + 1e-9, name
