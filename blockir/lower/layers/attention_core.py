"""What attention computes between its projections: grouped keys, scaled scores, masks, ALiBi, dropout.

``AttentionCore`` holds the settings (causality, window, scale, soft-cap, dropout, implementation);
``attend`` and ``attend_alibi`` compute the attended values from per-head queries, keys and values.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from blockir.lower.layers.masks import MaskBuilder
from blockir.lower.layers.numerics import BatchSlice
from blockir.lower.layers.query_rows import WHOLE, QueryRows
from blockir.lower.rng import MASK32, fmix32, keep_block

# a tensor-parallel rank's query heads: (rank, ranks), the rank holding heads [rank·h, (rank + 1)·h) of ranks·h
ALL_HEADS = (0, 1)


# where the keyed dropout hands its probabilities instead of drawing: set while ``recording_dropout`` runs
_recorder: Callable[[Tensor, float], None] | None = None


@contextmanager
def recording_dropout(record: Callable[[Tensor, float], None]) -> Iterator[None]:
    """While inside, ``drop_probs`` draws nothing: it hands each call's (probabilities, p) to ``record`` and
    returns the probabilities as they are, so a run under it is deterministic and says where it drops (the
    lift reads a compiled attention's dropout so)."""
    global _recorder
    outer, _recorder = _recorder, record
    try:
        yield
    finally:
        _recorder = outer


def drop_probs(probs: Tensor, p: float, heads: tuple[int, int], rows: QueryRows = WHOLE) -> Tensor:
    """Inverted dropout of attention probabilities ``[B, H, Sq, Sk]`` keyed by their logical coordinates.

    One seed per call comes from torch's generator (every rank and the one-process run draw the same); each
    keep decision is a hash of (seed, global batch row, global query head, global query, key), so a rank
    holding some heads (``heads``, set by ``parallelize``), a data-parallel slice of the batch
    (``BatchSlice``) or a context-parallel slice of the queries (``rows``, one run of them or, load-balanced,
    two; their keys are all the keys) draws exactly the decisions the unsharded run draws there, and a recomputed forward replays them."""
    if _recorder is not None:
        _recorder(probs, p)
        return probs
    key = fmix32(torch.randint(0, MASK32 + 1, (), dtype=torch.int64))
    (rank, ranks), (index, count) = heads, BatchSlice.current
    b, h, sq, sk = probs.shape
    runs, queries = rows.queries(sq)
    keep = torch.cat([keep_block(key, p, (b * count, h * ranks, queries, sk), (index * b, rank * h, first, 0),
                                 (b, h, n, sk), device=probs.device) for first, n in runs], dim=2)
    return torch.where(keep, probs * (1.0 / (1.0 - p)), 0.0)


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """Share each key/value head across ``groups`` consecutive query heads (GQA).

    Expand-then-reshape, as HF's ``repeat_kv``: with one key/value head the result stays a view, and
    the score matmul then rounds as HF's does (a copy would change its summation order).
    """
    if groups == 1:
        return x
    # expand, then copy, as HF's repeat_kv: repeat_interleave holds the same values, yet the matmuls
    # that read it do not round identically
    return x[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)


def _scaled_query(q: Tensor, core: "AttentionCore") -> tuple[Tensor, float | None]:
    """The queries and the score scale: with ``scale_query`` the queries carry the scale, and the scores get 1."""
    if not core.scale_query:
        return q, core.scale
    return q * (core.scale if core.scale is not None else q.shape[-1] ** -0.5), 1.0


def attend(q: Tensor, k: Tensor, v: Tensor, masks: MaskBuilder, core: "AttentionCore", training: bool,
            groups: int, prev: Tensor | None = None, heads: tuple[int, int] = ALL_HEADS,
            rows: QueryRows = WHOLE) -> Any:
    """Attention over heads ``[B, H, S, hd]`` -> ``[B, S, H, hd]``, obeying the masks, causality and window.

    The fast path is one ``scaled_dot_product_attention``; the eager path (and any soft-capped
    attention) spells out HF's eager reference op for op, so it is bit-exact against it. ``groups``
    (query heads per key/value head) comes from the module, not from shapes, so tracing meets no test.
    With ``core.score_residual`` (RealFormer) the previous scores ``prev`` join the pre-softmax scores
    before the mask, and the result is ``(output, scores)``: the running sum (or mean) the next layer reads.
    Dropout on the probabilities (``drop_probs``) takes the eager path, which holds them; ``rows`` places
    the queries among the sequence's for its keys.
    """
    if core.impl == "eager" and core.kv_cache:  # a KV cache hands the eager op contiguous keys and values, and
        # matmuls round by layout
        k, v = k.contiguous(), v.contiguous()
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    q, scale = _scaled_query(q, core)
    if core.window is not None:
        masks.window(core.window, q.device)
    p = core.dropout if training else 0.0
    if core.impl == "sdpa" and core.softcap is None and core.score_residual is None and not p:
        mask, is_causal = masks.build(core.causal, q.dtype, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                              scale=scale).transpose(1, 2)
    if core.scores_f32:
        q, k = q.float(), k.float()
    if core.divide_scores:  # Falcon's eager op divides by sqrt(head_dim), which rounds otherwise than multiplying
        scores = torch.matmul(q, k.transpose(2, 3)) / (math.sqrt(q.shape[-1]) if scale is None else 1 / scale)
    else:
        scores = torch.matmul(q, k.transpose(2, 3)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if core.softcap is not None:
        scores = torch.tanh(scores / core.softcap) * core.softcap
    carried = None
    if core.score_residual == "sum":
        scores = carried = scores + prev
    elif core.score_residual == "mean":
        n = core.score_count
        scores = carried = ((n - 1) * prev + scores) / n
    mask, _ = masks.build(core.causal, v.dtype, q.device, additive=True)
    if mask is not None:
        scores = scores + mask
    if core.softmax_f32:
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    else:
        probs = F.softmax(scores, dim=-1).type(v.dtype)
    if p:
        probs = drop_probs(probs, p, heads, rows)
    out = torch.matmul(probs, v).transpose(1, 2).contiguous()
    return out if carried is None else (out, carried)


def alibi_slopes(heads: int, device: torch.device) -> Tensor:
    """ALiBi's per-head slopes (Press et al., "Train Short, Test Long", arXiv:2108.12409), computed as BLOOM does.

    A geometric sequence from 2^(-8/n) for the largest power of two n <= heads; the remaining heads
    take every other term of the sequence for 2n.
    """
    n = 2 ** math.floor(math.log2(heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(n) - 3))), device=device, dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + n, device=device, dtype=torch.int32))
    if n != heads:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * n) - 3))), device=device, dtype=torch.float32)
        odd = torch.arange(1, 1 + 2 * min(n, heads - n), 2, device=device, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra, odd)], dim=0)
    return slopes


def alibi_bias(keep: object, batch: int, heads: int, keys: int, dtype: torch.dtype, device: torch.device,
               head_span: tuple[int, int] | None = None) -> Tensor:
    """``[B, H, 1, K]``: slope × key position, positions counted over the kept keys of a ``[B, K]`` keep-mask.

    ``head_span`` (first, total): the ``heads`` present are heads first… of ``total`` (a tensor-parallel rank's),
    whose slopes are those of the whole sequence of ``total``, not a sequence of their own."""
    if isinstance(keep, Tensor) and keep.dim() == 2 and not keep.is_floating_point():
        positions = ((keep.long().cumsum(dim=-1) - 1) * keep.long())[:, None, :]
    else:  # no keep-mask: every key is real
        positions = torch.arange(keys, device=device).expand(batch, 1, keys)
    first, total = head_span or (0, heads)
    slopes = alibi_slopes(total, device)[first:first + heads]
    return (slopes[..., None] * positions).to(dtype).view(batch, heads, 1, keys)


def attend_alibi(q: Tensor, k: Tensor, v: Tensor, masks: MaskBuilder, core: "AttentionCore", training: bool,
                  keep: object, groups: int, head_span: tuple[int, int] | None = None,
                  heads: tuple[int, int] = ALL_HEADS, rows: QueryRows = WHOLE) -> Tensor:
    """Attention with ALiBi biases: the fast path adds them to the SDPA mask; the eager path is BLOOM's
    ``baddbmm``/``bmm`` over folded heads, op for op, so it is bit-exact against it. ``head_span`` places the
    heads present among all (see ``alibi_bias``), ``rows`` the queries among the sequence's (``drop_probs``)."""
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    if core.window is not None:
        masks.window(core.window, q.device)
    (b, h, s, hd), keys = q.shape, k.shape[2]
    bias = alibi_bias(keep, b, h, keys, q.dtype, q.device, head_span)
    scale = core.scale if core.scale is not None else hd ** -0.5
    p = core.dropout if training else 0.0
    if core.impl == "sdpa" and core.softcap is None and not p:
        masks._add(bias)
        mask, _ = masks.build(core.causal, q.dtype, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(1, 2)
    scores = bias.reshape(b * h, 1, keys).baddbmm(batch1=q.reshape(b * h, s, hd),
                                                   batch2=k.reshape(b * h, keys, hd).transpose(-1, -2),
                                                   beta=1.0, alpha=scale).view(b, h, s, keys)
    if core.softcap is not None:
        scores = torch.tanh(scores / core.softcap) * core.softcap
    mask, _ = masks.build(core.causal, q.dtype, q.device, additive=True)
    if mask is not None:
        scores = scores + mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if p:
        probs = drop_probs(probs, p, heads, rows)
    context = torch.bmm(probs.view(b * h, s, keys), v.reshape(b * h, keys, hd))
    return context.view(b, h, s, hd).transpose(1, 2).contiguous()


class AttentionCore:
    """What happens between the projections: causality, window, scale, soft-cap, dropout, implementation."""

    def __init__(self, causal: bool = True, window: int | None = None, scale: float | None = None,
                 softcap: float | None = None, dropout: float = 0.0, impl: str = "sdpa",
                 softmax_f32: bool = True, score_residual: str | None = None, score_count: int = 1,
                 scale_query: bool = False, kv_cache: bool = False, scores_f32: bool = False,
                 divide_scores: bool = False) -> None:
        self.causal, self.window, self.scale, self.softcap = causal, window, scale, softcap
        self.dropout, self.impl, self.softmax_f32, self.scale_query = dropout, impl, softmax_f32, scale_query
        # the running mean's l: how many layers' scores the state averages once this one's are in
        self.score_residual, self.score_count = score_residual, score_count
        self.kv_cache, self.scores_f32, self.divide_scores = kv_cache, scores_f32, divide_scores

    def __repr__(self) -> str:
        parts = [f"causal={self.causal}", f"impl={self.impl}"]
        parts += [f"{k}={v}" for k, v in (("window", self.window), ("scale", self.scale),
                                          ("softcap", self.softcap), ("score_residual", self.score_residual))
                  if v is not None]
        parts += [f"score_count={self.score_count}"] if self.score_residual == "mean" else []
        return ", ".join(parts + ([f"dropout={self.dropout}"] if self.dropout else []))
