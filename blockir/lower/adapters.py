"""Adapters that let a compiled block call real HF / torch submodules as branches.

A ``.block`` file declares a branch as ``extern``; the user binds it with
``bind={"name": (module, adapter)}``. blockir registers ``module`` under the
declaration's name (so its parameters keep their real keys) and calls
``adapter(module, *inputs, **ctx)``, where ``inputs`` are the branch's tensor
arguments and ``ctx`` the extra keyword arguments given to the compiled
module's forward. Each adapter returns exactly the tensor the real layer adds
to (or, for Post-LN layers, normalises together with) its residual stream.

Every adapter takes the keyword arguments its real parent passes and ignores
any others, so one ``ctx`` can feed every branch of a layer and every layer of
a stack. Those it names are what it reads: each adapter here is marked
:func:`named_context`, so a compiled module binding it accepts the keywords its
signature names (its ``**ctx`` only absorbs what other branches read) and calls
it with those alone. An unmarked adapter that takes ``**ctx`` may pass anything
on, and makes the compiled module accept any keyword. ``ctx`` carries what the
parent model builds once per forward:

* HF models: ``attention_mask`` in the format the model's attention
  implementation expects (for ``eager``: an additive float mask
  ``[B, 1, S, S]`` from ``transformers.masking_utils``, or ``None``),
  ``position_embeddings`` (the ``(cos, sin)`` pair from the model's rotary
  embedding) and ``position_ids``.
* ``nn.TransformerEncoderLayer``: ``src_mask``, ``src_key_padding_mask`` and
  ``is_causal``, exactly as its ``forward`` takes them.

Modules whose forward is just ``module(x)`` still get a named adapter so a
``bind`` dict reads the same for every branch. A module bound without an
adapter is called as ``module(*inputs, **ctx)`` with ``ctx`` narrowed to the
keywords its ``forward`` accepts (:func:`plain_call`).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from torch import Tensor, nn
from torch.nn import functional as F

from blockir.lower.boundary import signature_keywords
from blockir.diagnostics import BlockError, argument_error

Adapter = Callable[..., Tensor]
NAMED_CONTEXT = "blockir_named_context"  # the attribute named_context sets


def named_context(adapter: Adapter) -> Adapter:
    """Mark an adapter as reading exactly the keywords its signature names: its ``**ctx`` only absorbs the
    keywords other branches read, so a compiled module binding it accepts no more for its sake."""
    setattr(adapter, NAMED_CONTEXT, True)
    return adapter


def _passthrough(position_ids: Tensor | None) -> dict[str, Any]:
    # HF layers forward position_ids to their attention as a keyword; eager
    # attention ignores it but flash/packed kernels read it, so keep it when given.
    return {} if position_ids is None else {"position_ids": position_ids}


@named_context
def call_module(module: nn.Module, *inputs: Tensor, **ctx: Any) -> Tensor:
    """Any branch whose real call is ``module(*inputs)`` with no side inputs."""
    return module(*inputs)


@dataclass(frozen=True)
class PlainCall:
    """The adapter of a module bound without one: ``module(*inputs, **ctx)``, ``ctx`` narrowed to what
    ``forward`` accepts, so one ``ctx`` can feed every branch as the adapters' contract promises.

    ``keywords`` is None when ``forward`` takes ``**kwargs`` (every key is passed but the parameter
    names the inputs already fill); ``taken`` are those names.
    """

    keywords: frozenset[str] | None
    taken: frozenset[str]

    def __call__(self, module: nn.Module, *inputs: Tensor, **ctx: Any) -> Tensor:
        if self.keywords is None:
            return module(*inputs, **{k: v for k, v in ctx.items() if k not in self.taken})
        return module(*inputs, **{k: v for k, v in ctx.items() if k in self.keywords})


def plain_call(module: nn.Module, inputs: int) -> PlainCall:
    """The default adapter for ``module`` called with ``inputs`` positional tensors.

    A compiled module reads the keywords of its own call contract, whatever its generated ``forward`` says.
    """
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # a forward without a Python signature takes no keywords we can know
        return PlainCall(frozenset(), frozenset())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    taken = frozenset(p.name for p in positional[:inputs])
    contract = getattr(module, "blockir_contract", None)
    if contract is not None:
        return PlainCall(contract.keywords, taken)
    return PlainCall(signature_keywords(module.forward, inputs), taken)


def adapter_keywords(adapter: Adapter, inputs: int) -> frozenset[str] | None:
    """The context keywords an adapter reads (None: any): a plain call's, a :func:`named_context` adapter's named
    keywords, else those its signature names after the module and the inputs (any, when it takes ``**ctx``)."""
    if isinstance(adapter, PlainCall):
        return adapter.keywords
    return signature_keywords(adapter, 1 + inputs, named_only=getattr(adapter, NAMED_CONTEXT, False))


# ---------------------------------------------------------------- Llama family


@named_context
def llama_attention(
    module: nn.Module,
    x: Tensor,
    *,
    position_embeddings: tuple[Tensor, Tensor],
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    **ctx: Any,
) -> Tensor:
    """``LlamaAttention`` as ``LlamaDecoderLayer.forward`` calls it.

    Mirrors ``self.self_attn(hidden_states=..., attention_mask=...,
    position_embeddings=..., position_ids=...)[0]``; the output already went
    through ``o_proj``.
    """
    out, _ = module(
        hidden_states=x,
        position_embeddings=position_embeddings,
        attention_mask=attention_mask,
        **_passthrough(position_ids),
    )
    return out


# Olmo2DecoderLayer calls its attention exactly as Llama's does; the full-width q_norm / k_norm
# are applied inside the module, so they travel with the bound module.
olmo2_attention = llama_attention


@named_context
def gemma2_attention(
    module: nn.Module,
    x: Tensor,
    *,
    position_embeddings: tuple[Tensor, Tensor],
    attention_mask: Tensor | dict[str, Tensor | None] | None = None,
    position_ids: Tensor | None = None,
    **ctx: Any,
) -> Tensor:
    """``Gemma2Attention`` as ``Gemma2DecoderLayer.forward`` calls it.

    ``Gemma2Model`` builds one mask per layer type (full / sliding window) and
    hands each layer the one for ``config.layer_types[i]``. ``attention_mask``
    may be that per-type dict, so one ``ctx`` serves a mixed stack; a plain
    tensor is used as is. Query scaling (``query_pre_attn_scalar``) and logit
    softcapping happen inside the module.
    """
    if isinstance(attention_mask, dict):
        attention_mask = attention_mask[module.layer_type or "full_attention"]
    return llama_attention(module, x, position_embeddings=position_embeddings, attention_mask=attention_mask,
                           position_ids=position_ids)


@named_context
def gated_mlp(module: nn.Module, x: Tensor, **ctx: Any) -> Tensor:
    """``LlamaMLP`` / ``Gemma2MLP`` / ``Olmo2MLP``: ``self.mlp(hidden_states)``."""
    return module(x)


# ---------------------------------------------------------------------- GPT-2


@named_context
def gpt2_attention(
    module: nn.Module,
    x: Tensor,
    *,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    **ctx: Any,
) -> Tensor:
    """``GPT2Attention`` (self-attention) as ``GPT2Block.forward`` calls it.

    Mirrors ``self.attn(hidden_states, attention_mask=...)[0]``. The result has
    been through ``c_proj`` and the module's own ``resid_dropout``, so that
    dropout belongs to the branch. Causality comes only from
    ``attention_mask``: the eager path has no built-in causal buffer, so
    omitting the mask silently gives bidirectional attention.
    """
    out, _ = module(x, attention_mask=attention_mask, **_passthrough(position_ids))
    return out


@named_context
def gpt2_mlp(module: nn.Module, x: Tensor, **ctx: Any) -> Tensor:
    """``GPT2MLP``: ``self.mlp(hidden_states)``, its trailing dropout included."""
    return module(x)


# ----------------------------------------------------------------------- BERT


@named_context
def bert_self_attention(
    module: nn.Module,
    x: Tensor,
    *,
    attention_mask: Tensor | None = None,
    **ctx: Any,
) -> Tensor:
    """``BertSelfAttention`` (``layer.attention.self``) as ``BertAttention`` calls it.

    Returns the attention context (heads merged) *before* ``attention.output.dense``:
    the output projection, its dropout and the Post-LN belong to the block.
    """
    out, _ = module(x, attention_mask=attention_mask)
    return out


# ------------------------------------------------------------------- GPT-NeoX


@named_context
def gpt_neox_attention(
    module: nn.Module,
    x: Tensor,
    *,
    position_embeddings: tuple[Tensor, Tensor],
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    **ctx: Any,
) -> Tensor:
    """``GPTNeoXAttention`` as ``GPTNeoXLayer.forward`` calls it.

    Mirrors ``self.attention(h, attention_mask=..., position_embeddings=...)[0]``
    (fused ``query_key_value``, partial rotary, ``dense``). The layer's
    ``post_attention_dropout`` is applied outside, by the block.
    """
    out, _ = module(
        x,
        attention_mask=attention_mask,
        position_embeddings=position_embeddings,
        **_passthrough(position_ids),
    )
    return out


@named_context
def gpt_neox_mlp(module: nn.Module, x: Tensor, **ctx: Any) -> Tensor:
    """``GPTNeoXMLP``: ``self.mlp(h)``; ``post_mlp_dropout`` is the block's."""
    return module(x)


# ------------------------------------------------------------------------- T5


@named_context
def t5_dense_relu_dense(module: nn.Module, x: Tensor, **ctx: Any) -> Tensor:
    """``T5DenseActDense`` / ``T5DenseGatedActDense`` as ``T5LayerFF`` calls them.

    ``wi`` → act → inner dropout → (cast to ``wo``'s dtype) → ``wo``; the
    dropout on the branch output is the block's.
    """
    return module(x)


# ---------------------------------------------------------------------- torch


@named_context
def multihead_attention(
    module: nn.MultiheadAttention,
    x: Tensor,
    *,
    src_mask: Tensor | None = None,
    src_key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    **ctx: Any,
) -> Tensor:
    """``nn.MultiheadAttention`` as ``nn.TransformerEncoderLayer._sa_block`` calls it.

    The layer first turns boolean masks into additive float masks of the
    input's dtype (``F._canonical_mask``), then calls
    ``self_attn(x, x, x, attn_mask=..., key_padding_mask=...,
    need_weights=False, is_causal=...)[0]``. ``dropout1`` is the block's.
    Boolean masks follow torch's convention: ``True`` means *masked out*.
    """
    src_key_padding_mask = F._canonical_mask(
        mask=src_key_padding_mask,
        mask_name="src_key_padding_mask",
        other_type=F._none_or_dtype(src_mask),
        other_name="src_mask",
        target_type=x.dtype,
    )
    src_mask = F._canonical_mask(
        mask=src_mask,
        mask_name="src_mask",
        other_type=None,
        other_name="",
        target_type=x.dtype,
        check_other=False,
    )
    out, _ = module(
        x,
        x,
        x,
        attn_mask=src_mask,
        key_padding_mask=src_key_padding_mask,
        need_weights=False,
        is_causal=is_causal,
    )
    return out


ADAPTERS: dict[str, Adapter] = {
    "LlamaAttention": llama_attention,
    "LlamaMLP": gated_mlp,
    "Olmo2Attention": olmo2_attention,
    "Olmo2MLP": gated_mlp,
    "Gemma2Attention": gemma2_attention,
    "Gemma2MLP": gated_mlp,
    "GPT2Attention": gpt2_attention,
    "GPT2MLP": gpt2_mlp,
    "BertSelfAttention": bert_self_attention,
    "GPTNeoXAttention": gpt_neox_attention,
    "GPTNeoXMLP": gpt_neox_mlp,
    "T5DenseActDense": t5_dense_relu_dense,
    "T5DenseGatedActDense": t5_dense_relu_dense,
    "MultiheadAttention": multihead_attention,
}


def adapter_for(module: nn.Module) -> Adapter:
    """The adapter registered for ``module``'s class name."""
    name = type(module).__name__
    if name not in ADAPTERS:
        raise BlockError([argument_error("lower.adapters.adapter_for", "module",
                                         f"no adapter for {name}; known: {', '.join(sorted(ADAPTERS))}",
                                         "write one, adapter(module, *inputs, **ctx) -> Tensor, and bind "
                                         "(module, adapter)")])
    return ADAPTERS[name]
