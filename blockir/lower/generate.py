"""Greedy and sampled decoding with the model's KV cache, as transformers' ``generate`` decodes.

The prompt runs once (prefill) into a cache preallocated for prompt plus new tokens; each step
then feeds only the token just chosen. Positions come from the mask as HF's generation derives
them (kept tokens counted from 0, padded ones at 0), so a left-padded row continues as it would
unpadded. The next token's scores are the last position's logits in fp32, then, when sampling,
divided by ``temperature``, cut to the ``top_k`` largest and to the smallest set whose probability
reaches ``top_p`` (HF's warpers, in that order); a sequence that has produced an end-of-sequence
token continues with ``pad_token_id``, and decoding stops once every sequence has finished, so
the result holds at most ``S + max_new_tokens`` columns. Unset ``eos_token_id`` and
``pad_token_id`` take the folder's generation config, then its config; with an end-of-sequence
token and no pad token, the first end-of-sequence token pads. A model whose LongRoPE attention has
``rope_recache=true`` drops its cache at the first step whose sequence is longer than the original
context and recomputes every position there, as Phi-3's ``prepare_inputs_for_generation`` does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from blockir.lower.layers.embedding import Head
from blockir.lower.layers.kv_cache import KVCache
from blockir.diagnostics import BlockError, Span, error

if TYPE_CHECKING:
    from blockir.lower.layers.causal_lm import CausalLM


def _wrong(argument: str, message: str, hint: str | None = None) -> BlockError:
    return BlockError([error("E0839", message, Span(f"blockir.CausalLM.generate({argument}=…)", 0, 0), hint=hint)])


def _token_ids(value: Any, argument: str) -> list[int]:
    """Non-negative ids; one beyond the vocabulary is never produced, so it never stops (as in HF)."""
    ids = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                     for i in ids):
        raise _wrong(argument, f"{argument} must be a token id (a non-negative int) or a list of them, got {value!r}")
    return list(ids)


def _check(input_ids: Any, max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any, generator: Any) -> None:
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point() or \
            input_ids.dtype == torch.bool or input_ids.shape[1] == 0:
        got = f"shape {list(input_ids.shape)} and dtype {input_ids.dtype}" if isinstance(input_ids, Tensor) \
            else type(input_ids).__name__
        raise _wrong("input_ids", f"input_ids must be integer token ids [batch, seq] with seq >= 1, got {got}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise _wrong("max_new_tokens", f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise _wrong("temperature", f"temperature must be a positive number, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise _wrong("top_k", f"top_k must be a non-negative int (0: no cut), got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 <= top_p <= 1):
        raise _wrong("top_p", f"top_p must be a number in [0, 1], got {top_p!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise _wrong("generator", f"generator must be a torch.Generator, got {type(generator).__name__}")


def warp(scores: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """HF's sampling warpers on fp32 scores ``[B, V]``: temperature, then top-k, then top-p (each keeps one token)."""
    if temperature != 1.0:
        scores = scores / temperature
    if top_k:
        k = min(top_k, scores.shape[-1])
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -float("inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False)
        drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(1, order, drop), -float("inf"))
    return scores


@torch.no_grad()
def generate(lm: "CausalLM", input_ids: Tensor, max_new_tokens: int = 16, *, attention_mask: Tensor | None = None,
             do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None,
             generator: torch.Generator | None = None) -> Tensor:
    """``input_ids`` ``[B, S]`` followed by the chosen tokens: a LongTensor ``[B, S + n]``, ``n <= max_new_tokens``."""
    _check(input_ids, max_new_tokens, temperature, top_k, top_p, generator)
    batch, seq = input_ids.shape
    if attention_mask is not None and (not isinstance(attention_mask, Tensor) or
                                       tuple(attention_mask.shape) != (batch, seq)):
        got = list(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise _wrong("attention_mask", f"attention_mask must be [batch, seq] = [{batch}, {seq}], got {got}")
    eos_given = eos_token_id if eos_token_id is not None else lm.special_token("eos_token_id")
    eos = _token_ids(eos_given, "eos_token_id") if eos_given is not None else []
    pad_given = pad_token_id if pad_token_id is not None else lm.special_token("pad_token_id")
    pad = _token_ids(pad_given, "pad_token_id")[0] if pad_given is not None else (eos[0] if eos else None)
    ids = input_ids.long()
    keep = attention_mask.long() if attention_mask is not None else torch.ones_like(ids)
    positions = (keep.cumsum(-1) - 1).masked_fill(keep == 0, 0)
    padded = bool((keep == 0).any())
    cache = KVCache(capacity=seq + max_new_tokens)
    step_ids, step_positions = ids, positions
    # only the last position's scores are read: the heads see that position alone (HF's logits_to_keep=1)
    hooks = [m.register_forward_pre_hook(_last_position) for m in lm.modules() if isinstance(m, Head)]
    try:
        return _decode(lm, ids, keep, padded, step_positions, cache, max_new_tokens, do_sample, float(temperature),
                       top_k, top_p, eos, pad, generator)
    finally:
        for hook in hooks:
            hook.remove()


def _last_position(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (args[0][:, -1:], *args[1:])


def _decode(lm: "CausalLM", ids: Tensor, keep: Tensor, padded: bool, step_positions: Tensor, cache: KVCache,
            max_new_tokens: int, do_sample: bool, temperature: float, top_k: int | None, top_p: float | None,
            eos: list[int], pad: int | None, generator: torch.Generator | None) -> Tensor:
    batch = ids.shape[0]
    unfinished = torch.ones(batch, dtype=torch.bool, device=ids.device)
    stops = torch.tensor(eos, dtype=torch.long, device=ids.device)
    step_ids = ids
    for _ in range(max_new_tokens):
        if lm.recache_at is not None and ids.shape[1] > lm.recache_at >= cache.get_seq_length():
            # the first step past the original context recomputes every position, as Phi-3's generation does
            cache = KVCache(capacity=cache.capacity)
            step_ids, step_positions = ids, (keep.cumsum(-1) - 1).masked_fill(keep == 0, 0)
        # without padding the mask says nothing the causal kernels do not: leave it out, as HF does
        logits = lm(step_ids, attention_mask=keep if padded else None, position_ids=step_positions,
                    past_key_values=cache).logits
        scores = logits[:, -1].to(dtype=torch.float32, copy=True)
        if do_sample:
            probs = warp(scores, temperature, top_k, top_p).softmax(dim=-1)
            chosen = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)
        else:
            chosen = scores.argmax(dim=-1)
        if eos:
            chosen = torch.where(unfinished, chosen, torch.full_like(chosen, pad))
            unfinished &= ~torch.isin(chosen, stops)
        ids = torch.cat([ids, chosen[:, None]], dim=-1)
        if eos and not bool(unfinished.any()):
            break
        step_ids, step_positions = chosen[:, None], step_positions[:, -1:] + 1
        keep = torch.cat([keep, keep.new_ones(batch, 1)], dim=-1)
    return ids
