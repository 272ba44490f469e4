"""Self- and cross-attention branches: their projections under a checkpoint's names and layouts.

Submodule names follow the HF LLaMA layout (``q_proj``/``k_proj``/``v_proj``/``o_proj``) unless a
declaration names others, so a real checkpoint's attention weights load with a strict
``load_state_dict``.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from blockir.diagnostics import UNKNOWN_SPAN, BlockError, Span, error
from blockir.lower.layers import numerics, rotary
from blockir.lower.layers.attention_core import ALL_HEADS, AttentionCore, attend, attend_alibi, repeat_kv
from blockir.lower.layers.dense import dense
from blockir.lower.layers.fixup_bias import OUT, add_biases, shift
from blockir.lower.layers.kv_cache import KVCache
from blockir.lower.layers.masks import MaskBuilder
from blockir.lower.layers.query_rows import WHOLE, QueryRows
from blockir.lower.layers.norm_module import make_norm
from blockir.lower.layers.rotary import apply_rope, call_length, rope_cos_sin
from blockir.norms import FAMILIES


def _split_heads(x: Tensor, head_dim: int) -> Tensor:
    """[B, S, H*hd] -> [B, H, S, hd]."""
    return x.view(*x.shape[:-1], -1, head_dim).transpose(1, 2)


class _DottedLayers(nn.Module):
    """Layers registered under dotted names (BERT's ``self.query``, ``output.dense``) live in nested containers.

    A checkpoint that nests a branch's projections one level deeper than the branch loads strictly,
    and a norm declared at ``<branch>.output.LayerNorm`` joins the same container.
    """

    def add_module(self, name: str, module: nn.Module | None) -> None:
        *path, leaf = name.split(".")
        owner: nn.Module = self
        for part in path:
            if part not in owner._modules:
                nn.Module.add_module(owner, part, nn.Module())
            owner = owner._modules[part]  # type: ignore[assignment]
        nn.Module.add_module(owner, leaf, module)

    def __getattr__(self, name: str) -> Tensor | nn.Module:
        if "." in name:
            return self.get_submodule(name)
        return super().__getattr__(name)


class _Projections(_DottedLayers):
    """The attention projections, under the names and in the layout a checkpoint stores them.

    ``fused``: ``none`` (separate q, k, v), ``stacked`` (one matrix whose rows are all of q, then
    k, then v: Phi-3's ``qkv_proj``, GPT-2's ``c_attn``) or ``heads`` (per head q, k, v in turn:
    GPT-NeoX's ``query_key_value``). ``conv1d`` stores every matrix as GPT-2's ``[in, out]``.
    """

    def __init__(
        self,
        width: int,
        heads: int,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = False,
        out_bias: bool = False,
        name: str = "attention",
        span: Span = UNKNOWN_SPAN,
        *,
        kv_width: int | None = None,
        fused: str = "none",
        conv1d: bool = False,
        names: dict[str, str] | None = None,
        qk_norm: str = "none",
        qk_norm_axis: str = "head",
        qk_norm_eps: float = 1e-6,
        qk_norm_cast: str = "before_weight",
        qk_norm_offset: int = 0,
        qkv_groups: int = 1,
        qk_scale: bool = False,
        core: AttentionCore | None = None,
        head_scale: bool = False,
        fixup_bias: bool = False,
    ) -> None:
        super().__init__()
        # plain settings go straight to __dict__ (here and in the branches below): nn.Module.__setattr__
        # costs ~1.5 µs each, which compiling a 1,000-layer stack pays tens of thousands of times
        settings = vars(self)
        settings.update(name=name, span=span)  # the declaration, for diagnostics about the masks it is given
        kv_heads = kv_heads or heads
        if heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        if head_dim is None:
            if width % heads:
                raise ValueError(f"width ({width}) is not divisible by heads ({heads}); pass head_dim")
            head_dim = width // heads
        names = {**DEFAULT_NAMES, **(names or {})}
        settings.update(width=width, heads=heads, kv_heads=kv_heads, head_dim=head_dim, fused=fused,
                        qkv_groups=qkv_groups, core=core or AttentionCore(), names=names, qk_norm=qk_norm, qk_norm_axis=qk_norm_axis)
        # (first, total): the heads this module computes are heads first… of total (a tensor-parallel rank's), for
        # what depends on a head's index among all of them (ALiBi's slopes); None: all of them
        settings.update(head_span=None)
        # (rank, ranks): which of the query heads a tensor-parallel rank holds, for the probabilities' dropout
        settings.update(head_shard=ALL_HEADS)
        q_out, kv_out = heads * head_dim, kv_heads * head_dim
        if fused == "none":
            for role, out in (("q", q_out), ("k", kv_out), ("v", kv_out)):
                src = width if role == "q" else (kv_width or width)
                self.add_module(names[role], dense(src, out, bias, conv1d))
        else:
            self.add_module(names["qkv"], dense(width, q_out + 2 * kv_out, bias, conv1d))
        self.add_module(names["o"], dense(q_out, width, out_bias, conv1d))
        if qk_norm != "none":
            size = head_dim if qk_norm_axis == "head" else None
            for role, count in (("q_norm", heads), ("k_norm", kv_heads)):
                n = size or count * head_dim
                norm = make_norm(qk_norm, n, eps=qk_norm_eps, offset=qk_norm_offset, cast=qk_norm_cast)
                self.add_module(names[role], norm)
        # nGPT's s_qk (arXiv:2410.01131), stored at 1/sqrt(width) so that Adam moves it at the rate of the matrices
        self.qk_scale = nn.Parameter(torch.full((q_out,), width ** -0.5)) if qk_scale else None
        if head_scale:
            self.head_scale = nn.Parameter(torch.ones(heads))
        if fixup_bias:  # the value mixing is linear: the one scalar bias between V and O sits before O
            add_biases(self, OUT)

    def project(self, x: Tensor, memory: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v as ``[B, H, S, hd]`` after the q/k norms."""
        hd = self.head_dim
        if self.fused == "none":
            src = x if memory is None else memory
            q = getattr(self, self.names["q"])(x)
            k = getattr(self, self.names["k"])(src)
            v = getattr(self, self.names["v"])(src)
        elif self.fused == "stacked":
            q_out, kv_out = self.heads * hd, self.kv_heads * hd
            q, k, v = getattr(self, self.names["qkv"])(x).split((q_out, kv_out, kv_out), dim=-1)
        elif self.fused == "qvk_groups":  # CodeGen: each row group holds q, v, k of heads / groups heads
            groups = getattr(self, self.names["qkv"])(x).reshape(*x.shape[:-1], self.qkv_groups, -1)
            share = self.heads * hd // self.qkv_groups
            q, v, k = (t.reshape(*x.shape[:-1], self.heads, hd) for t in groups.split(share, -1))
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            return self._norm_heads(q, "q_norm"), self._norm_heads(k, "k_norm"), v
        else:
            # the q/k norms see [B, S, H, hd], as Persimmon's do: the order autograd sums their gains' gradients in
            q, k, v = getattr(self, self.names["qkv"])(x).view(*x.shape[:-1], -1, 3 * hd).chunk(3, dim=-1)
            q, k = self._norm_heads(q, "q_norm"), self._norm_heads(k, "k_norm")
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.qk_norm != "none" and self.qk_norm_axis == "width":
            q, k = getattr(self, self.names["q_norm"])(q), getattr(self, self.names["k_norm"])(k)
        q, k, v = _split_heads(q, hd), _split_heads(k, hd), _split_heads(v, hd)
        return self._norm_heads(q, "q_norm"), self._norm_heads(k, "k_norm"), v

    def _norm_heads(self, t: Tensor, role: str) -> Tensor:
        if (f := FAMILIES.get(self.qk_norm)) is None or f.unit_length or self.qk_norm_axis != "head":
            return t
        return getattr(self, self.names[role])(t)

    def sphere_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """nGPT's q and k ``[B, H, S, hd]``, after RoPE: each head unit-normalized (``qk_norm=l2norm``), then
        times s_qk; a key head of a query group takes its group's first query head's gain."""
        if (f := FAMILIES.get(self.qk_norm)) is not None and f.unit_length and self.qk_norm_axis == "head":
            q, k = getattr(self, self.names["q_norm"])(q), getattr(self, self.names["k_norm"])(k)
        if self.qk_scale is None:
            return q, k
        # the heads present: a tensor-parallel rank holds some of them, and the shard of s_qk they read
        s = (numerics.meeting(self.qk_scale, q) * self.width ** 0.5).view(-1, 1, self.head_dim)
        return q * s, k * s[::s.shape[0] // k.shape[-3]]

    def out(self, y: Any) -> Any:
        """``y`` [B, S, H, hd] through the per-head scales, if any, then the output projection; a score-carrying
        attention passes its scores through beside it."""
        if isinstance(y, tuple):
            return self.out(y[0]), y[1]
        scales = numerics.meeting(self._parameters.get("head_scale"), y)
        if scales is not None:
            y = y * scales.to(y.dtype)[:, None]
        return getattr(self, self.names["o"])(shift(y.flatten(-2), self, OUT))

    # the rows of the sequence this module's calls hold: all of them, unless context parallelism splits them
    query_rows: ClassVar[QueryRows] = WHOLE

    def masks(self, x: Tensor, keys: int | None = None) -> MaskBuilder:
        """Masks for the queries of ``x`` over ``keys`` keys (default: its own positions, the very same size
        object, so that a symbolic trace never compares two traced sizes)."""
        seq = x.shape[1]
        queries, first = self.query_rows.span(seq)
        return MaskBuilder(self.name, self.span, (x.shape[0], self.heads, queries, seq if keys is None else keys),
                           first)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, kv_heads={self.kv_heads}, head_dim={self.head_dim}, {self.core!r}"


DEFAULT_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "qkv": "qkv_proj",
                 "q_norm": "q_norm", "k_norm": "k_norm"}


class SelfAttention(_Projections):
    """Multi-head self-attention: GQA/MQA, RoPE (half-split or interleaved, partial), q/k norms, window."""

    def __init__(
        self,
        width: int,
        heads: int,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        causal: bool = True,
        rope: bool = False,
        rope_theta: float = 10000.0,
        bias: bool = False,
        out_bias: bool = False,
        name: str = "self_attention",
        span: Span = UNKNOWN_SPAN,
        *,
        rope_style: str = "half",
        rotary_dim: int | None = None,
        alibi: bool = False,
        rope_freqs: str = "f32",
        rope_f32: bool = False,
        rope_scaling: rotary.RopeScaling | None = None,
        rope_tables: str = "f32",
        kv_broadcast: bool = False,
        rope_recache: bool = False,
        **options: object,
    ) -> None:
        core = options.pop("core", None) or AttentionCore(causal=causal)
        super().__init__(width, heads, kv_heads, head_dim, bias, out_bias, name, span, core=core,  # type: ignore[arg-type]
                         **options)  # type: ignore[arg-type]
        vars(self).update(causal=causal, rope=rope, rope_theta=rope_theta, rope_style=rope_style,
                          rotary_dim=self.head_dim if rotary_dim is None else rotary_dim, rope_freqs=rope_freqs,
                          rope_f32=rope_f32, rope_scaling=rope_scaling, alibi=alibi, rope_tables=rope_tables,
                          kv_broadcast=kv_broadcast, rope_recache=rope_recache)
        dynamic = rope_scaling is not None and rope_scaling.kind == "dynamic"
        self.dynamic = rotary.DynamicFrequencies(rope_scaling) if dynamic else None  # type: ignore[arg-type]

    @property
    def blockir_context(self) -> frozenset[str]:
        """The masks it obeys, the KV cache it extends, and the caller's rotary tables when it rotates."""
        masks = frozenset({"attention_mask", "src_key_padding_mask", "past_key_values"})
        return masks | {"position_embeddings", "position_ids"} if self.rope else masks

    def forward(
        self,
        x: Tensor,
        scores: Tensor | None = None,
        *,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        attention_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        **ctx: object,
    ) -> Tensor:
        """``x`` [B, S, D] -> [B, S, D]; with score_residual, ``(x, scores)`` -> ``(y, scores)``.

        Caller-provided ``position_embeddings`` (cos, sin) win over the
        internal tables so that scaled RoPE variants computed by a host model
        are honoured; without them, ``position_ids`` (HF's ``[B or 1, S]``) are
        the positions the internal tables rotate by. ``attention_mask`` (HF's forms)
        and ``src_key_padding_mask`` (torch's) both apply, together with the block's causality.
        """
        rows = self.query_rows
        q, k, v = (rows.local(t) for t in self.project(x))
        groups = self.heads // self.kv_heads
        if self.kv_broadcast:  # every query head gets its own rotated key; a cache then stores one copy per head
            k, v, groups = repeat_kv(k, groups), repeat_kv(v, groups), 1
        if self.rope and self.rotary_dim:  # rotary_dim=0: this layer rotates nothing (Cohere 2's full layers)
            interleaved = self.rope_style == "interleaved"
            if position_embeddings is None:
                table = torch.float32 if self.rope_f32 else x.dtype
                freqs = x.dtype if self.rope_freqs == "input" else None
                # the whole call's longest position, before the positions are cut to the rows held
                length = call_length(position_ids, x.shape[1]) \
                    if self.rope_scaling is not None and self.rope_scaling.by_length else None
                position_ids = rows.positions(position_ids)
                grown = self.dynamic.update(self.rotary_dim, self.rope_theta, x.device, length) \
                    if self.dynamic is not None else None
                position_embeddings = rope_cos_sin(x.shape[1], self.rotary_dim, self.rope_theta, x.device, table,
                                                   interleaved, freqs, self.rope_scaling, position_ids, grown,
                                                   length)
            cos, sin = position_embeddings
            rotary = self.rotary_dim if self.rotary_dim != self.head_dim else None
            dtype = q.dtype
            if self.rope_f32 and self.rope_tables == "input":
                # the host rounds its tables to the input dtype and casts q and k to f32 before rotating: one f32
                # node per head, so autograd sums both uses' gradients in f32 before the cast back
                cos, sin, q, k = cos.to(dtype).float(), sin.to(dtype).float(), q.float(), k.float()
            # f32 tables rotate in f32; the rotated heads return to the projections' dtype
            q = apply_rope(q, cos, sin, interleaved, rotary).to(dtype)
            k = apply_rope(k, cos, sin, interleaved, rotary).to(dtype)
        q, k = self.sphere_qk(q, k)
        cache = ctx.get("past_key_values")
        if cache is not None:  # a KVCache (kv_cache.py): this call's keys join the ones held, then all are attended
            if not isinstance(cache, KVCache):
                raise BlockError([error("E0838", f"past_key_values must be a blockir.KVCache, got "
                                         f"{type(cache).__name__}", Span("<call>", 1, 1),
                                         hint="pass the cache a previous call returned (use_cache=True), or none")])
            k, v = cache.update(self, k, v)
        k, v = rows.keys(k, v)
        masks = self.masks(x, k.shape[2] if cache is not None else None)
        masks.attention_mask(attention_mask, "attention_mask")
        masks.key_padding_mask(src_key_padding_mask, "src_key_padding_mask")
        if self.alibi:
            return self.out(rows.stream(attend_alibi(q, k, v, masks, self.core, self.training, attention_mask,
                                                     groups, self.head_span, self.head_shard, rows)))
        return self.out(rows.stream(attend(q, k, v, masks, self.core, self.training, groups, scores, self.head_shard,
                                           rows)))

    def extra_repr(self) -> str:
        rope = f"rope={self.rope}, rope_theta={self.rope_theta}, rope_style={self.rope_style}, " \
               f"rotary_dim={self.rotary_dim}"
        return f"{super().extra_repr()}, {rope}"


class CrossAttention(_Projections):
    """Attention from queries of ``x`` to keys/values of an encoder ``memory``; never causal."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("core", AttentionCore(causal=False))
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    blockir_context: ClassVar[frozenset[str]] = frozenset({"memory_mask", "memory_key_padding_mask"})

    def forward(self, x: Tensor, memory: Tensor, scores: Tensor | None = None, *,
                memory_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, **ctx: object) -> Tensor:
        """``x`` [B, T, D], ``memory`` [B, S, D] -> [B, T, D].

        ``memory_mask`` takes the forms of a self-attention's ``attention_mask`` over the memory's
        positions (a ``[B, S]`` keep-mask, or ``[B, H, T, S]`` boolean or additive);
        ``memory_key_padding_mask`` is torch's ``[B, S]`` (True = padded memory position).
        """
        masks = self.masks(x, memory.shape[1])
        masks.attention_mask(memory_mask, "memory_mask")
        masks.key_padding_mask(memory_key_padding_mask, "memory_key_padding_mask")
        q, k, v = self.project(x, memory)
        q, k = self.sphere_qk(q, k)
        return self.out(attend(q, k, v, masks, self.core, self.training,
                                     self.heads // self.kv_heads, scores, self.head_shard))


# torch.fx.symbolic_trace records this as one call: its body reads shapes as Python values.
torch.fx.wrap("_split_heads")
