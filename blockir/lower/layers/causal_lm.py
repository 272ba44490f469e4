"""A compiled ``*ForCausalLM`` program with the calling convention of a transformers causal LM.

``lm(input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False)``
returns a :class:`CausalLMOutput` (``.logits``, ``.past_key_values``). Positions follow the host
family's forward when none are given: the cache's length plus ``0..S-1`` for every family but
those whose position embedding counts the kept tokens of the mask (OPT), as HF computes them.
The wrapper shares its parameter, buffer and submodule tables with the compiled module, so its
``state_dict`` keys are the checkpoint's and ``to``/``eval``/``load_state_dict`` act on both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from blockir.lower.layers.kv_cache import KVCache
from blockir.diagnostics import BlockError, Span, error

SHARED = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_load_state_dict_pre_hooks",
          "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_post_hooks")
KEYWORDS = ("attention_mask", "position_ids", "past_key_values", "use_cache")


def _wrong(argument: str, message: str, hint: str | None = None) -> BlockError:
    return BlockError([error("E0838", message, Span(f"blockir.CausalLM({argument}=…)", 0, 0), hint=hint)])


@dataclass
class CausalLMOutput:
    """``logits`` ``[B, S, V]`` and the cache that now holds these positions (None without one)."""

    logits: Tensor
    past_key_values: KVCache | None = None

    @property
    def cache(self) -> KVCache | None:
        """transformers' newer name for the returned cache."""
        return self.past_key_values


class CausalLM(nn.Module):
    """The compiled model ``module`` of ``program``'s block ``name``, called as an HF causal LM.

    ``config`` is the folder's ``config.json`` (its special token ids are ``generate``'s defaults);
    ``generation`` the folder's ``generation_config.json``, whose entries win over the config's.
    """

    def __init__(self, module: nn.Module, name: str, config: Mapping[str, Any],
                 generation: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        for key in SHARED:
            self.__dict__[key] = module.__dict__[key]
        self.__dict__["compiled"] = module  # not a child: its children are this module's
        self.name, self.config, self.generation_config = name, dict(config), dict(generation or {})
        # OPT counts positions over the kept tokens of the mask; every other family from the cache's length
        self.mask_positions = any(getattr(m, "positions", False) and getattr(m, "mask_positions", False)
                                  for m in module.modules())
        # Phi-3 decodes past its original context by recomputing the sequence once, with the long factors
        self.recache_at: int | None = min((m.rope_scaling.original_max for m in module.modules()
                                           if getattr(m, "rope_recache", False)), default=None)

    def train(self, mode: bool = True) -> "CausalLM":
        self.compiled.training = mode  # the compiled graph reads its own flag
        return super().train(mode)

    def positions(self, input_ids: Tensor, attention_mask: Tensor | None, past: int) -> Tensor:
        """HF's default ``position_ids`` for this family's forward."""
        if self.mask_positions and attention_mask is not None:
            keep = attention_mask.long()
            return (keep.cumsum(-1) * keep - 1)[:, past:]
        return torch.arange(past, past + input_ids.shape[1], device=input_ids.device)[None]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                past_key_values: KVCache | None = None, use_cache: bool = False, **unknown: Any) -> CausalLMOutput:
        if unknown:
            name = sorted(unknown)[0]
            raise _wrong(name, f"{self.name} takes no keyword '{name}'", "accepted: " + ", ".join(KEYWORDS))
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point() or \
                input_ids.dtype == torch.bool:
            shape = f"a {input_ids.dim()}-axis {input_ids.dtype} tensor" if isinstance(input_ids, Tensor) \
                else type(input_ids).__name__
            raise _wrong("input_ids", f"input_ids must be integer token ids [batch, seq], got {shape}")
        if past_key_values is not None and not isinstance(past_key_values, KVCache):
            raise _wrong("past_key_values", f"past_key_values must be a blockir KVCache, got "
                         f"{type(past_key_values).__name__}", "pass the cache an earlier call returned "
                         "(use_cache=True), or blockir.KVCache()")
        cache = past_key_values if past_key_values is not None else KVCache() if use_cache else None
        past = cache.get_seq_length() if cache is not None else 0
        batch, seq = input_ids.shape
        if attention_mask is not None and (not isinstance(attention_mask, Tensor) or
                                           tuple(attention_mask.shape) != (batch, past + seq)):
            got = list(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise _wrong("attention_mask", f"attention_mask must be [batch, past + seq] = [{batch}, {past + seq}] "
                         f"(the cached positions and these), got {got}")
        if position_ids is None:
            position_ids = self.positions(input_ids, attention_mask, past)
        elif not isinstance(position_ids, Tensor) or position_ids.dim() != 2 or position_ids.shape[1] != seq or \
                position_ids.is_floating_point():
            got = list(position_ids.shape) if isinstance(position_ids, Tensor) else type(position_ids).__name__
            raise _wrong("position_ids", f"position_ids must be integer positions [batch or 1, {seq}], got {got}")
        ctx: dict[str, Any] = {"position_ids": position_ids}
        if attention_mask is not None:
            ctx["attention_mask"] = attention_mask
        if cache is not None:
            ctx["past_key_values"] = cache
        reads = self.compiled.blockir_contract.keywords  # ALiBi and learned-position models read no position_ids
        if reads is not None:
            ctx = {k: v for k, v in ctx.items() if k in reads}
        logits = self.compiled(input_ids, **ctx)
        return CausalLMOutput(logits, cache)

    def generate(self, input_ids: Tensor, max_new_tokens: int = 16, **options: Any) -> Tensor:
        """Continue ``input_ids`` by up to ``max_new_tokens`` tokens; see :func:`blockir.lower.generate.generate`."""
        from blockir.lower.generate import generate
        return generate(self, input_ids, max_new_tokens, **options)

    def special_token(self, key: str) -> Any:
        """A special token id as HF's generation config holds it: ``generation_config.json`` first."""
        value = self.generation_config.get(key)
        return self.config.get(key) if value is None else value
