"""Builders for the real reference layers the example ``.block`` files describe.

Each ``build_*`` returns a :class:`RealLayer`: a tiny, randomly initialised real
module (hidden 64, 4 heads, 2 kv heads where the architecture has them,
intermediate 128), a maker of random inputs ``(x, ctx)`` at ``B=2, S=5``, a
``reference(x, **ctx)`` that runs the real module the way its parent model
does, and the ``bind`` dict for the branches the ``.block`` declares
``extern``. Models are built from configs only, with eager attention, in
``eval()`` mode; ``dropout`` sets every dropout probability of the config so a
caller can ``.train()`` the module when it needs dropout.

``ctx`` is what the compiled module's forward receives as keyword arguments
and what the adapters read: for HF layers ``attention_mask`` (the parent
model's own mask for eager attention: additive float ``[B, 1, S, S]``, or
``None`` where the parent skips it), ``position_embeddings`` (``(cos, sin)``
from the model's rotary embedding) and ``position_ids``; for
``nn.TransformerEncoderLayer`` ``src_mask``, ``src_key_padding_mask`` and
``is_causal``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from blockir.lower import adapters as A

B, S, D, F, H, KV = 2, 5, 64, 128, 4, 2
HEAD_DIM = D // H
EXAMPLES_DIR = "examples"

Ctx = dict[str, Any]


@dataclass
class RealLayer:
    """One real reference module and everything needed to compare a block with it."""

    name: str  # the real class
    example: str  # the .block file, relative to the repository root
    block: str  # the block / model name inside it
    module: nn.Module
    make_inputs: Callable[..., tuple[Tensor, Ctx]]  # (seed=0, padded=False) -> (x, ctx)
    reference: Callable[..., Tensor]  # reference(x, **ctx)
    bind: dict[str, tuple[nn.Module, A.Adapter]]
    # real keys the block does not declare (parts of the real model outside the block)
    outside_keys: tuple[str, ...] = field(default=())

    def block_state_dict(self) -> dict[str, Tensor]:
        """The real ``state_dict`` restricted to the keys the block declares."""
        return {k: v for k, v in self.module.state_dict().items() if k not in self.outside_keys}


# ----------------------------------------------------------------- helpers


def _fan_in(owner: nn.Module, p: Tensor) -> int:
    # GPT-2's Conv1D stores its weight as [in, out]; everything else as [out, in]
    return p.shape[0] if type(owner).__name__ == "Conv1D" else p.shape[1]


@torch.no_grad()
def _randomize(module: nn.Module, seed: int) -> None:
    """Deterministic weights of a useful scale; norm parameters moved off their init.

    Norm weights start at 1 (or 0 for Gemma2's ``1 + w``) and biases at 0; an
    implementation with the wrong offset, cast order or a dropped bias would
    still match there, so every norm parameter gets noise added.
    """
    gen = torch.Generator().manual_seed(10_007 * seed + 1)
    for owner in module.modules():
        is_norm = "Norm" in type(owner).__name__
        for p in owner.parameters(recurse=False):
            noise = torch.randn(p.shape, generator=gen)
            if is_norm:
                p.add_(0.3 * noise)
            elif p.ndim >= 2:
                p.copy_(noise * _fan_in(owner, p) ** -0.5)
            else:
                p.copy_(0.1 * noise)


def _finish(module: nn.Module, seed: int, dtype: torch.dtype) -> nn.Module:
    _randomize(module, seed)
    # cast parameters only: a model loaded in bf16 keeps its float32 rotary
    # inv_freq buffer, and module.to(bf16) would round it
    for p in module.parameters():
        p.data = p.data.to(dtype)
    return module.eval()


def _eager(config: Any) -> Any:
    # eager attention is plain matmul/softmax on CPU: deterministic and no
    # kernel-specific mask shortcuts
    config._attn_implementation = "eager"
    return config


def _x(seed: int, dtype: torch.dtype) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, S, D, generator=gen).to(dtype)


def _padding_mask(padded: bool) -> Tensor:
    """HF 2D mask: 1 = real token. With ``padded`` the second row ends in one pad."""
    mask = torch.ones(B, S, dtype=torch.long)
    if padded:
        mask[1, -1] = 0
    return mask


def _position_ids() -> Tensor:
    # what the HF models derive when no cache and no position_ids are given
    return torch.arange(S).unsqueeze(0)


def _causal_ctx(config: Any, rotary: nn.Module | None, x: Tensor, padded: bool) -> Ctx:
    """The per-layer kwargs a causal HF decoder model builds once per forward."""
    from transformers.masking_utils import create_causal_mask

    position_ids = _position_ids()
    ctx: Ctx = {
        "attention_mask": create_causal_mask(
            config=config,
            inputs_embeds=x,
            attention_mask=_padding_mask(padded),
            cache=None,
            position_ids=position_ids,
        ),
        "position_ids": position_ids,
    }
    if rotary is not None:
        ctx["position_embeddings"] = rotary(x, position_ids)
    return ctx


def _decoder_io(config: Any, rotary: nn.Module, layer: nn.Module, dtype: torch.dtype
                ) -> tuple[Callable[..., tuple[Tensor, Ctx]], Callable[..., Tensor]]:
    """make_inputs and reference for a rotary decoder layer, called as its parent model calls it."""

    def make_inputs(seed: int = 0, padded: bool = False) -> tuple[Tensor, Ctx]:
        x = _x(seed, dtype)
        return x, _causal_ctx(config, rotary, x, padded)

    def reference(x: Tensor, **ctx: Any) -> Tensor:
        mask = ctx.get("attention_mask")
        if isinstance(mask, dict):  # Gemma2Model's per-layer-type mapping
            mask = mask[config.layer_types[0]]
        return layer(x, attention_mask=mask, position_ids=ctx.get("position_ids"),
                     position_embeddings=ctx["position_embeddings"])

    return make_inputs, reference


# -------------------------------------------------------------------- Llama


def _llama_config(layers: int) -> Any:
    from transformers import LlamaConfig

    return _eager(
        LlamaConfig(
            hidden_size=D,
            num_attention_heads=H,
            num_key_value_heads=KV,
            intermediate_size=F,
            num_hidden_layers=layers,
            vocab_size=64,
        )
    )


def build_llama_decoder_layer(dtype: torch.dtype = torch.float32, dropout: float = 0.0, seed: int = 0) -> RealLayer:
    """``LlamaDecoderLayer`` ↔ ``examples/llama.block`` block ``LlamaDecoderLayer``.

    Self-attention and MLP are built-ins in the block (their keys match), so
    ``bind`` is empty; ``llama_attention`` composes the layer by hand.
    """
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = _llama_config(1)
    config.attention_dropout = dropout
    layer = _finish(LlamaDecoderLayer(config, layer_idx=0), seed, dtype)
    rotary = LlamaRotaryEmbedding(config=config)
    make_inputs, reference = _decoder_io(config, rotary, layer, dtype)

    return RealLayer("LlamaDecoderLayer", f"{EXAMPLES_DIR}/llama.block", "LlamaDecoderLayer",
                     layer, make_inputs, reference, bind={})


def build_llama_model(dtype: torch.dtype = torch.float32, dropout: float = 0.0, seed: int = 0) -> RealLayer:
    """``LlamaModel`` (2 layers) ↔ ``examples/llama.block`` model ``LlamaModel``.

    The block covers ``layers`` and ``norm``; ``embed_tokens`` stays outside
    (``outside_keys``). ``reference`` runs the real ``LlamaModel.forward`` with
    ``inputs_embeds=x``: it applies no scaling or dropout to the embeddings,
    takes a prepared 4D mask as is, recomputes the same rotary table from
    ``position_ids``, and returns ``norm(layers(x))``.
    """
    from transformers import LlamaModel

    config = _llama_config(2)
    config.attention_dropout = dropout
    model = _finish(LlamaModel(config), seed, dtype)

    def make_inputs(seed: int = 0, padded: bool = False) -> tuple[Tensor, Ctx]:
        x = _x(seed, dtype)
        return x, _causal_ctx(config, model.rotary_emb, x, padded)

    def reference(x: Tensor, **ctx: Any) -> Tensor:
        out = model(
            inputs_embeds=x,
            attention_mask=ctx.get("attention_mask"),
            position_ids=ctx.get("position_ids"),
            use_cache=False,
        )
        return out.last_hidden_state

    return RealLayer("LlamaModel", f"{EXAMPLES_DIR}/llama.block", "LlamaModel",
                     model, make_inputs, reference, bind={}, outside_keys=("embed_tokens.weight",))


# -------------------------------------------------------------------- GPT-2


def build_gpt2_block(dtype: torch.dtype = torch.float32, dropout: float = 0.0, seed: int = 0) -> RealLayer:
    """``GPT2Block`` ↔ ``examples/gpt2.block`` block ``GPT2Block``.

    ``attn`` and ``mlp`` are extern: their ``Conv1D`` weights are stored
    ``[in, out]``, and each carries its own output dropout.
    """
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = _eager(GPT2Config(
        n_embd=D, n_head=H, n_inner=F, n_layer=1, vocab_size=64, bos_token_id=None, eos_token_id=None,
        resid_pdrop=dropout, attn_pdrop=dropout, embd_pdrop=dropout,
    ))
    block = _finish(GPT2Block(config, layer_idx=0), seed, dtype)

    def make_inputs(seed: int = 0, padded: bool = False) -> tuple[Tensor, Ctx]:
        x = _x(seed, dtype)
        return x, _causal_ctx(config, None, x, padded)

    def reference(x: Tensor, **ctx: Any) -> Tensor:
        return block(x, None, ctx.get("attention_mask"), position_ids=ctx.get("position_ids"))

    bind = {"attn": (block.attn, A.gpt2_attention), "mlp": (block.mlp, A.gpt2_mlp)}
    return RealLayer("GPT2Block", f"{EXAMPLES_DIR}/gpt2.block", "GPT2Block", block, make_inputs, reference, bind)


# --------------------------------------------------------------------- BERT


def build_bert_layer(dtype: torch.dtype = torch.float32, dropout: float = 0.0, seed: int = 0) -> RealLayer:
    """``BertLayer`` (encoder, Post-LN) ↔ ``examples/bert.block`` block ``BertLayer``.

    ``BertModel`` builds a bidirectional mask; for eager attention it is an
    additive ``[B, 1, S, S]`` float mask when some key is padded and ``None``
    otherwise.
    """
    from transformers import BertConfig
    from transformers.masking_utils import create_bidirectional_mask
    from transformers.models.bert.modeling_bert import BertLayer

    config = _eager(BertConfig(
        hidden_size=D, num_attention_heads=H, intermediate_size=F, num_hidden_layers=1, vocab_size=64,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    ))
    layer = _finish(BertLayer(config, layer_idx=0), seed, dtype)

    def make_inputs(seed: int = 0, padded: bool = False) -> tuple[Tensor, Ctx]:
        x = _x(seed, dtype)
        mask = create_bidirectional_mask(config=config, inputs_embeds=x, attention_mask=_padding_mask(padded))
        return x, {"attention_mask": mask}

    def reference(x: Tensor, **ctx: Any) -> Tensor:
        return layer(x, ctx.get("attention_mask"))

    bind = {"attention.self": (layer.attention.self, A.bert_self_attention)}
    return RealLayer("BertLayer", f"{EXAMPLES_DIR}/bert.block", "BertLayer", layer, make_inputs, reference, bind)


# ----------------------------------------------------------------- GPT-NeoX


def build_gpt_neox_layer(dtype: torch.dtype = torch.float32, dropout: float = 0.0, seed: int = 0) -> RealLayer:
    """``GPTNeoXLayer`` (``use_parallel_residual=True``) ↔ ``examples/gpt_neox.block``.

    Keeps the config's default ``partial_rotary_factor=0.25``: rotary covers
    the first 4 of 16 head dims, and the ``(cos, sin)`` in ``ctx`` are 4 wide.
    """
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXLayer, GPTNeoXRotaryEmbedding

    config = _eager(GPTNeoXConfig(
        hidden_size=D, num_attention_heads=H, intermediate_size=F, num_hidden_layers=1, vocab_size=64,
        bos_token_id=None, eos_token_id=None, use_parallel_residual=True,
        hidden_dropout=dropout, attention_dropout=dropout,
    ))
    layer = _finish(GPTNeoXLayer(config, layer_idx=0), seed, dtype)
    rotary = GPTNeoXRotaryEmbedding(config=config)
    make_inputs, reference = _decoder_io(config, rotary, layer, dtype)

    bind = {
        "attention": (layer.attention, A.gpt_neox_attention),
        "mlp": (layer.mlp, A.gpt_neox_mlp),
    }
    return RealLayer("GPTNeoXLayer", f"{EXAMPLES_DIR}/gpt_neox.block", "GPTNeoXLayer",
                     layer, make_inputs, reference, bind)


# ------------------------------------------------------------------- Gemma2


def build_gemma2_decoder_layer(
    dtype: torch.dtype = torch.float32,
    dropout: float = 0.0,
    seed: int = 0,
    *,
    attn_logit_softcapping: float | None = None,
) -> RealLayer:
    """``Gemma2DecoderLayer`` ↔ ``examples/gemma2.block`` block ``Gemma2DecoderLayer``.

    Made a plain full-attention layer: ``layer_types=["full_attention"]`` (the
    config's default makes layer 0 a sliding-window layer; with
    ``sliding_window=4096 > S`` it would attend to everything anyway, but its
    mask would come from ``create_sliding_window_causal_mask``),
    ``query_pre_attn_scalar=head_dim`` (the default 256 would scale scores by
    1/16 instead of 1/sqrt(16)) and no logit softcapping unless asked for.
    The attention is extern, so these only matter to anyone swapping in the
    built-in ``self_attention``.
    """
    from transformers import Gemma2Config
    from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer, Gemma2RotaryEmbedding

    config = _eager(Gemma2Config(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=KV, head_dim=HEAD_DIM,
        intermediate_size=F, num_hidden_layers=1, vocab_size=64, layer_types=["full_attention"],
        query_pre_attn_scalar=HEAD_DIM, attn_logit_softcapping=attn_logit_softcapping,
        attention_dropout=dropout,
    ))
    layer = _finish(Gemma2DecoderLayer(config, layer_idx=0), seed, dtype)
    rotary = Gemma2RotaryEmbedding(config=config)
    make_inputs, reference = _decoder_io(config, rotary, layer, dtype)

    bind = {"self_attn": (layer.self_attn, A.gemma2_attention)}
    return RealLayer("Gemma2DecoderLayer", f"{EXAMPLES_DIR}/gemma2.block", "Gemma2DecoderLayer",
                     layer, make_inputs, reference, bind)


# -------------------------------------------------------------------- Olmo2


def build_olmo2_decoder_layer(dtype: torch.dtype = torch.float32, dropout: float = 0.0, seed: int = 0) -> RealLayer:
    """``Olmo2DecoderLayer`` ↔ ``examples/olmo2.block`` block ``Olmo2DecoderLayer``.

    The attention is extern because it owns ``q_norm`` / ``k_norm``.
    """
    from transformers import Olmo2Config
    from transformers.models.olmo2.modeling_olmo2 import Olmo2DecoderLayer, Olmo2RotaryEmbedding

    config = _eager(Olmo2Config(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=KV, intermediate_size=F,
        num_hidden_layers=1, vocab_size=64, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        attention_dropout=dropout,
    ))
    layer = _finish(Olmo2DecoderLayer(config, layer_idx=0), seed, dtype)
    rotary = Olmo2RotaryEmbedding(config=config)
    make_inputs, reference = _decoder_io(config, rotary, layer, dtype)

    bind = {"self_attn": (layer.self_attn, A.olmo2_attention)}
    return RealLayer("Olmo2DecoderLayer", f"{EXAMPLES_DIR}/olmo2.block", "Olmo2DecoderLayer",
                     layer, make_inputs, reference, bind)


# ----------------------------------------------------------------------- T5


def build_t5_layer_ff(dtype: torch.dtype = torch.float32, dropout: float = 0.0, seed: int = 0) -> RealLayer:
    """``T5LayerFF`` (non-gated, ReLU) ↔ ``examples/t5.block`` block ``T5LayerFF``. Needs no ``ctx``."""
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5LayerFF

    config = T5Config(d_model=D, d_ff=F, num_heads=H, d_kv=HEAD_DIM, num_layers=1, vocab_size=64,
                      dropout_rate=dropout, feed_forward_proj="relu")
    layer = _finish(T5LayerFF(config), seed, dtype)

    def make_inputs(seed: int = 0, padded: bool = False) -> tuple[Tensor, Ctx]:
        return _x(seed, dtype), {}

    def reference(x: Tensor, **ctx: Any) -> Tensor:
        return layer(x)

    bind = {"DenseReluDense": (layer.DenseReluDense, A.t5_dense_relu_dense)}
    return RealLayer("T5LayerFF", f"{EXAMPLES_DIR}/t5.block", "T5LayerFF", layer, make_inputs, reference, bind)


# ---------------------------------------------------- nn.TransformerEncoderLayer


@contextlib.contextmanager
def mha_fastpath(enabled: bool) -> Iterator[None]:
    """Temporarily switch torch's fused inference path for MHA / encoder layers."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def build_transformer_encoder_layer(
    dtype: torch.dtype = torch.float32,
    dropout: float = 0.0,
    seed: int = 0,
    *,
    norm_first: bool = False,
) -> RealLayer:
    """``nn.TransformerEncoderLayer(batch_first=True)`` ↔ ``examples/torch_encoder.block``.

    Block ``TransformerEncoderLayer`` for ``norm_first=False`` (Post-LN),
    ``TransformerEncoderLayerNormFirst`` for ``True``. ``reference`` runs the
    layer's Python path, the one training and autograd use: in ``eval`` under
    ``no_grad`` torch would otherwise switch to a fused kernel that agrees only
    to about 5e-7 in fp32. ``make_inputs(padded=True)`` adds a boolean
    ``src_key_padding_mask`` (``True`` = padding); ``causal=True`` adds a boolean
    causal ``src_mask`` (``True`` = masked) with ``is_causal=True``.
    """
    layer = nn.TransformerEncoderLayer(
        D, H, dim_feedforward=F, dropout=dropout, batch_first=True, norm_first=norm_first,
    )
    layer = _finish(layer, seed, dtype)

    def make_inputs(seed: int = 0, padded: bool = False, causal: bool = False) -> tuple[Tensor, Ctx]:
        ctx: Ctx = {}
        if padded:
            ctx["src_key_padding_mask"] = _padding_mask(True) == 0
        if causal:
            # boolean like the padding mask: torch deprecates mixing mask types
            ctx["src_mask"] = torch.ones(S, S, dtype=torch.bool).triu(1)
            ctx["is_causal"] = True
        return _x(seed, dtype), ctx

    def reference(x: Tensor, **ctx: Any) -> Tensor:
        with mha_fastpath(False):
            return layer(
                x,
                src_mask=ctx.get("src_mask"),
                src_key_padding_mask=ctx.get("src_key_padding_mask"),
                is_causal=ctx.get("is_causal", False),
            )

    block = "TransformerEncoderLayerNormFirst" if norm_first else "TransformerEncoderLayer"
    bind = {"self_attn": (layer.self_attn, A.multihead_attention)}
    return RealLayer(block, f"{EXAMPLES_DIR}/torch_encoder.block", block, layer, make_inputs, reference, bind)


def build_transformer_encoder_layer_norm_first(
    dtype: torch.dtype = torch.float32, dropout: float = 0.0, seed: int = 0
) -> RealLayer:
    """``nn.TransformerEncoderLayer(norm_first=True)`` ↔ block ``TransformerEncoderLayerNormFirst``."""
    return build_transformer_encoder_layer(dtype, dropout, seed, norm_first=True)


# ------------------------------------------------------------------ registry

BUILDERS: dict[str, Callable[..., RealLayer]] = {
    "LlamaDecoderLayer": build_llama_decoder_layer,
    "LlamaModel": build_llama_model,
    "GPT2Block": build_gpt2_block,
    "BertLayer": build_bert_layer,
    "GPTNeoXLayer": build_gpt_neox_layer,
    "Gemma2DecoderLayer": build_gemma2_decoder_layer,
    "Olmo2DecoderLayer": build_olmo2_decoder_layer,
    "T5LayerFF": build_t5_layer_ff,
    "TransformerEncoderLayer": build_transformer_encoder_layer,
    "TransformerEncoderLayerNormFirst": build_transformer_encoder_layer_norm_first,
}

# registry name -> (example file, block name); the same pairs each RealLayer carries
EXAMPLES: dict[str, tuple[str, str]] = {
    "LlamaDecoderLayer": ("examples/llama.block", "LlamaDecoderLayer"),
    "LlamaModel": ("examples/llama.block", "LlamaModel"),
    "GPT2Block": ("examples/gpt2.block", "GPT2Block"),
    "BertLayer": ("examples/bert.block", "BertLayer"),
    "GPTNeoXLayer": ("examples/gpt_neox.block", "GPTNeoXLayer"),
    "Gemma2DecoderLayer": ("examples/gemma2.block", "Gemma2DecoderLayer"),
    "Olmo2DecoderLayer": ("examples/olmo2.block", "Olmo2DecoderLayer"),
    "T5LayerFF": ("examples/t5.block", "T5LayerFF"),
    "TransformerEncoderLayer": ("examples/torch_encoder.block", "TransformerEncoderLayer"),
    "TransformerEncoderLayerNormFirst": ("examples/torch_encoder.block", "TransformerEncoderLayerNormFirst"),
}
