"""Built-in branch modules: self-/cross-attention, plain and gated MLPs.

Submodule names follow the HF LLaMA layout (``q_proj``/``k_proj``/``v_proj``/
``o_proj``, ``gate_proj``/``up_proj``/``down_proj``) so a real checkpoint's
branch weights load with a strict ``load_state_dict``. Every forward takes
the block's whole context as keyword arguments and ignores the keys it does
not use, so a compiled block can pass one context to all of its branches.
Each module states the context keywords it reads as ``blockir_context``,
beside its ``forward``: a compiled module accepts exactly the keywords that
something it calls reads (``blockir.lower.boundary``).
"""
from __future__ import annotations

import math
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blockir.lower.layers.masks import MaskBuilder
from blockir.lower.layers import numerics, rotary
from blockir.lower.boundary import NOTHING
from blockir.lower.layers.numerics import ACTIVATIONS
from blockir.lower.layers.norm_module import make_norm
from blockir.norms import FAMILIES
from blockir.lower.layers.kv_cache import KVCache
from blockir.diagnostics import UNKNOWN_SPAN, BlockError, Span, error


def _activation(name: str) -> Callable[[Tensor], Tensor]:
    """Look up an activation by name, failing with the list of valid names."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}") from None


def _split_heads(x: Tensor, head_dim: int) -> Tensor:
    """[B, S, H*hd] -> [B, H, S, hd]."""
    return x.view(*x.shape[:-1], -1, head_dim).transpose(1, 2)


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    """Share each key/value head across ``groups`` consecutive query heads (GQA).

    Expand-then-reshape, as HF's ``repeat_kv``: with one key/value head the result stays a view, and
    the score matmul then rounds as HF's does (a copy would change its summation order).
    """
    if groups == 1:
        return x
    # expand, then copy, as HF's repeat_kv: repeat_interleave holds the same values, yet the matmuls
    # that read it do not round identically
    return x[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)


def rope_cos_sin(
    seq_len: int, head_dim: int, theta: float, device: torch.device, dtype: torch.dtype,
    interleaved: bool = False, freqs_dtype: torch.dtype | None = None, scaling: rotary.RopeScaling | None = None,
    positions: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """RoPE tables for positions ``0..seq_len-1``, shaped ``[1, S, head_dim]`` like HF's.

    Frequencies and angles are computed in fp32 and only the tables are cast,
    which is what the HF rotary module does, so both routes agree exactly.
    ``head_dim`` is the number of rotated coordinates (smaller under partial rotary).
    ``freqs_dtype`` first rounds the inverse frequencies to that dtype: an HF rotary
    module's ``inv_freq`` buffer after ``model.to(dtype)``, whose angles then differ in bf16.
    ``scaling`` is a context-extension scheme (see ``rotary``). ``positions`` (``[B or 1, S]``, HF's
    ``position_ids``) replaces ``0..seq_len-1``; the tables are then ``[B or 1, S, head_dim]``.
    """
    inv_freq = rotary.inv_freq(head_dim, theta, device, scaling)
    if freqs_dtype is not None:
        inv_freq = inv_freq.to(freqs_dtype).float()
    if positions is None:
        freqs = torch.arange(seq_len, device=device, dtype=torch.float32)[None, :, None] * inv_freq
    else:
        freqs = positions.to(device=device, dtype=torch.float32)[:, :, None] * inv_freq
    angles = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    factor = scaling.table_factor() if scaling is not None else 1.0
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return cos.to(dtype), sin.to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_pairs(x: Tensor) -> Tensor:
    """(x0, x1, x2, x3, …) -> (-x1, x0, -x3, x2, …): GPT-J's rotate-every-two."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False, rotary: int | None = None) -> Tensor:
    """Rotate the first ``cos.shape[-1]`` coordinates of ``x`` [B, H, S, hd] by tables [B or 1, S, rd].

    Rotate-half pairs coordinate ``i`` with ``i + rd/2`` (the layout HF LLaMA-style
    checkpoints' q/k weights assume); interleaved pairs ``2i`` with ``2i + 1`` (GPT-J).
    The remaining coordinates pass through (partial rotary, GPT-NeoX and Phi).
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    turn = _rotate_pairs if interleaved else _rotate_half
    if rotary is None:  # a module passes its own widths, so that symbolic tracing meets no shape test
        return x * cos + turn(x) * sin
    rot, rest = x[..., :rotary], x[..., rotary:]
    return torch.cat((rot * cos + turn(rot) * sin, rest), dim=-1)


class Conv1D(nn.Module):
    """GPT-2's transposed linear: ``weight`` stored ``[in, out]``, computed with one ``addmm`` as HF does."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        y = torch.addmm(self.bias, flat, self.weight) if self.bias is not None else flat @ self.weight
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def dense(in_features: int, out_features: int, bias: bool, conv1d: bool) -> nn.Module:
    """A projection stored as ``nn.Linear`` (``[out, in]``) or as GPT-2's ``Conv1D`` (``[in, out]``)."""
    return Conv1D(in_features, out_features, bias) if conv1d else nn.Linear(in_features, out_features, bias=bias)


def _scaled_query(q: Tensor, core: "AttentionCore") -> tuple[Tensor, float | None]:
    """The queries and the score scale: with ``scale_query`` the queries carry the scale, and the scores get 1."""
    if not core.scale_query:
        return q, core.scale
    return q * (core.scale if core.scale is not None else q.shape[-1] ** -0.5), 1.0


def _attend(q: Tensor, k: Tensor, v: Tensor, masks: MaskBuilder, core: "AttentionCore", training: bool,
            groups: int, prev: Tensor | None = None) -> Any:
    """Attention over heads ``[B, H, S, hd]`` -> ``[B, S, H, hd]``, obeying the masks, causality and window.

    The fast path is one ``scaled_dot_product_attention``; the eager path (and any soft-capped
    attention) spells out HF's eager reference op for op, so it is bit-exact against it. ``groups``
    (query heads per key/value head) comes from the module, not from shapes, so tracing meets no test.
    With ``core.score_residual`` (RealFormer) the previous scores ``prev`` join the pre-softmax scores
    before the mask, and the result is ``(output, scores)``: the running sum (or mean) the next layer reads.
    """
    if core.impl == "eager" and core.kv_cache:  # a KV cache hands the eager op contiguous keys and values, and
        # matmuls round by layout
        k, v = k.contiguous(), v.contiguous()
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    q, scale = _scaled_query(q, core)
    if core.window is not None:
        masks.window(core.window, q.device)
    p = core.dropout if training else 0.0
    if core.impl == "sdpa" and core.softcap is None and core.score_residual is None:
        mask, is_causal = masks.build(core.causal, q.dtype, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal,
                                              scale=scale).transpose(1, 2)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    if core.scores_f32:
        q, k = q.float(), k.float()
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
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
    probs = F.dropout(probs, p=p, training=training)
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


def alibi_bias(keep: object, batch: int, heads: int, keys: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[B, H, 1, K]``: slope × key position, positions counted over the kept keys of a ``[B, K]`` keep-mask."""
    if isinstance(keep, Tensor) and keep.dim() == 2 and not keep.is_floating_point():
        positions = ((keep.long().cumsum(dim=-1) - 1) * keep.long())[:, None, :]
    else:  # no keep-mask: every key is real
        positions = torch.arange(keys, device=device).expand(batch, 1, keys)
    return (alibi_slopes(heads, device)[..., None] * positions).to(dtype).view(batch, heads, 1, keys)


def _attend_alibi(q: Tensor, k: Tensor, v: Tensor, masks: MaskBuilder, core: "AttentionCore", training: bool,
                  keep: object, groups: int) -> Tensor:
    """Attention with ALiBi biases: the fast path adds them to the SDPA mask; the eager path is BLOOM's
    ``baddbmm``/``bmm`` over folded heads, op for op, so it is bit-exact against it."""
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    if core.window is not None:
        masks.window(core.window, q.device)
    (b, h, s, hd), keys = q.shape, k.shape[2]
    bias = alibi_bias(keep, b, h, keys, q.dtype, q.device)
    scale = core.scale if core.scale is not None else hd ** -0.5
    p = core.dropout if training else 0.0
    if core.impl == "sdpa" and core.softcap is None:
        masks._add(bias)
        mask, _ = masks.build(core.causal, q.dtype, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scale).transpose(1, 2)
    scores = bias.reshape(b * h, 1, keys).baddbmm(batch1=q.reshape(b * h, s, hd),
                                                   batch2=k.reshape(b * h, keys, hd).transpose(-1, -2),
                                                   beta=1.0, alpha=scale).view(b, h, s, keys)
    if core.softcap is not None:
        scores = torch.tanh(scores / core.softcap) * core.softcap
    mask, _ = masks.build(core.causal, q.dtype, q.device, additive=True)
    if mask is not None:
        scores = scores + mask
    probs = F.dropout(F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), p=p, training=training)
    context = torch.bmm(probs.view(b * h, s, keys), v.reshape(b * h, keys, hd))
    return context.view(b, h, s, hd).transpose(1, 2).contiguous()


class AttentionCore:
    """What happens between the projections: causality, window, scale, soft-cap, dropout, implementation."""

    def __init__(self, causal: bool = True, window: int | None = None, scale: float | None = None,
                 softcap: float | None = None, dropout: float = 0.0, impl: str = "sdpa",
                 softmax_f32: bool = True, score_residual: str | None = None, score_count: int = 1,
                 scale_query: bool = False, kv_cache: bool = False, scores_f32: bool = False) -> None:
        self.causal, self.window, self.scale, self.softcap = causal, window, scale, softcap
        self.dropout, self.impl, self.softmax_f32, self.scale_query = dropout, impl, softmax_f32, scale_query
        # the running mean's l: how many layers' scores the state averages once this one's are in
        self.score_residual, self.score_count = score_residual, score_count
        self.kv_cache, self.scores_f32 = kv_cache, scores_f32

    def __repr__(self) -> str:
        parts = [f"causal={self.causal}", f"impl={self.impl}"]
        parts += [f"{k}={v}" for k, v in (("window", self.window), ("scale", self.scale),
                                          ("softcap", self.softcap), ("score_residual", self.score_residual))
                  if v is not None]
        parts += [f"score_count={self.score_count}"] if self.score_residual == "mean" else []
        return ", ".join(parts + ([f"dropout={self.dropout}"] if self.dropout else []))


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
            qkv = getattr(self, self.names["qkv"])(x).view(*x.shape[:-1], -1, 3 * hd).transpose(1, 2)
            q, k, v = qkv.chunk(3, dim=-1)
            return self._norm_heads(q, "q_norm"), self._norm_heads(k, "k_norm"), v
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
        return getattr(self, self.names["o"])(y.flatten(-2))

    def masks(self, x: Tensor, keys: int | None = None) -> MaskBuilder:
        """Masks for the queries of ``x`` over ``keys`` keys (default: its own positions, the very same size
        object, so that a symbolic trace never compares two traced sizes)."""
        seq = x.shape[1]
        return MaskBuilder(self.name, self.span, (x.shape[0], self.heads, seq, seq if keys is None else keys))

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
        **options: object,
    ) -> None:
        core = options.pop("core", None) or AttentionCore(causal=causal)
        super().__init__(width, heads, kv_heads, head_dim, bias, out_bias, name, span, core=core,  # type: ignore[arg-type]
                         **options)  # type: ignore[arg-type]
        vars(self).update(causal=causal, rope=rope, rope_theta=rope_theta, rope_style=rope_style,
                          rotary_dim=self.head_dim if rotary_dim is None else rotary_dim, rope_freqs=rope_freqs,
                          rope_f32=rope_f32, rope_scaling=rope_scaling, alibi=alibi, rope_tables=rope_tables,
                          kv_broadcast=kv_broadcast)

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
        q, k, v = self.project(x)
        groups = self.heads // self.kv_heads
        if self.kv_broadcast:  # every query head gets its own rotated key; a cache then stores one copy per head
            k, v, groups = _repeat_kv(k, groups), _repeat_kv(v, groups), 1
        if self.rope and self.rotary_dim:  # rotary_dim=0: this layer rotates nothing (Cohere 2's full layers)
            interleaved = self.rope_style == "interleaved"
            if position_embeddings is None:
                table = torch.float32 if self.rope_f32 else x.dtype
                freqs = x.dtype if self.rope_freqs == "input" else None
                position_embeddings = rope_cos_sin(x.shape[1], self.rotary_dim, self.rope_theta, x.device, table,
                                                   interleaved, freqs, self.rope_scaling, position_ids)
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
        masks = self.masks(x, k.shape[2] if cache is not None else None)
        masks.attention_mask(attention_mask, "attention_mask")
        masks.key_padding_mask(src_key_padding_mask, "src_key_padding_mask")
        if self.alibi:
            return self.out(_attend_alibi(q, k, v, masks, self.core, self.training, attention_mask, groups))
        return self.out(_attend(q, k, v, masks, self.core, self.training, groups, scores))

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
        return self.out(_attend(q, k, v, masks, self.core, self.training,
                                     self.heads // self.kv_heads, scores))


class MLP(nn.Module):
    """Two-layer feed-forward branch ``fc2(act(fc1(x)))``, its layers under the checkpoint's names."""

    def __init__(self, width: int, hidden: int, act: str = "gelu", bias: bool = True, *, fc1: str = "fc1",
                 fc2: str = "fc2", conv1d: bool = False) -> None:
        super().__init__()
        vars(self).update(act_name=act, act=_activation(act), names={"fc1": fc1, "fc2": fc2})
        self.add_module(fc1, dense(width, hidden, bias, conv1d))
        self.add_module(fc2, dense(hidden, width, bias, conv1d))

    blockir_context: ClassVar[frozenset[str]] = NOTHING

    def forward(self, x: Tensor, **ctx: object) -> Tensor:
        return getattr(self, self.names["fc2"])(self.act(getattr(self, self.names["fc1"])(x)))

    def extra_repr(self) -> str:
        return f"act={self.act_name}"


class GatedMLP(nn.Module):
    """Gated feed-forward branch ``down(act(gate(x)) * up(x))`` (SwiGLU for ``act="silu"``).

    ``fused`` stores gate and up as one matrix whose first half of rows is the gate (Phi-3's
    ``gate_up_proj``).
    """

    def __init__(self, width: int, hidden: int, act: str = "silu", bias: bool = False, *, gate: str = "gate_proj",
                 up: str = "up_proj", down: str = "down_proj", gate_up: str = "gate_up_proj",
                 fused: bool = False) -> None:
        super().__init__()
        vars(self).update(act_name=act, act=_activation(act), fused=fused,
                          names={"gate": gate, "up": up, "down": down, "gate_up": gate_up})
        if fused:
            self.add_module(gate_up, nn.Linear(width, 2 * hidden, bias=bias))
        else:
            self.add_module(gate, nn.Linear(width, hidden, bias=bias))
            self.add_module(up, nn.Linear(width, hidden, bias=bias))
        self.add_module(down, nn.Linear(hidden, width, bias=bias))

    blockir_context: ClassVar[frozenset[str]] = NOTHING

    def forward(self, x: Tensor, **ctx: object) -> Tensor:
        if self.fused:
            gate, up = getattr(self, self.names["gate_up"])(x).chunk(2, dim=-1)
        else:
            gate, up = getattr(self, self.names["gate"])(x), getattr(self, self.names["up"])(x)
        return getattr(self, self.names["down"])(self.act(gate) * up)

    def extra_repr(self) -> str:
        return f"act={self.act_name}"


def mask_positions(keep: Tensor) -> Tensor:
    """Positions counted over the kept tokens of a ``[B, S]`` keep-mask, ``-1`` at padded ones (OPT's numbering)."""
    return (torch.cumsum(keep, dim=1) * keep - 1).long()


class Embedding(nn.Module):
    """A lookup table under the key ``weight``: token ids, or (``positions``) positions ``0..S-1`` (or the
    caller's ``position_ids``).

    ``scale`` multiplies the rows in the table's dtype, as Gemma's embedding normaliser does.
    ``padding_idx`` names a row that receives no gradient, as ``nn.Embedding``'s does.
    """

    def __init__(self, rows: int, width: int, positions: bool = False, scale: float | None = None,
                 offset: int = 0, mask_positions: bool = False, padding_idx: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(rows, width) * 0.02)
        self.positions, self.scale, self.offset, self.mask_positions = positions, scale, offset, mask_positions
        self.padding_idx = padding_idx

    @property
    def blockir_context(self) -> frozenset[str]:
        """A position table reads ``position_ids`` (and, numbered by the keep-mask, ``attention_mask``); a token
        table reads nothing."""
        if not self.positions:
            return NOTHING
        return frozenset({"position_ids", "attention_mask"} if self.mask_positions else {"position_ids"})

    def forward(self, ids: Tensor, **ctx: object) -> Tensor:
        if self.positions:
            given, keep = ctx.get("position_ids"), ctx.get("attention_mask")
            if isinstance(given, Tensor):  # the caller's positions win, as in HF's models
                return F.embedding(given.long() + self.offset, self.weight).expand(*ids.shape, -1)
            if self.mask_positions and isinstance(keep, Tensor) and keep.dim() == 2:
                return F.embedding(mask_positions(keep) + self.offset, self.weight)
            index = torch.arange(self.offset, self.offset + ids.shape[-1], device=ids.device)
            return F.embedding(index, self.weight).expand(*ids.shape, -1)
        y = F.embedding(ids.long(), self.weight, self.padding_idx)
        if self.scale is not None:
            y = y * torch.tensor(self.scale, dtype=y.dtype)
        return y

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, positions={self.positions}, offset={self.offset}, scale={self.scale}"


class Head(nn.Module):
    """Projection to vocabulary logits (``weight`` [V, D]); its weight may be the token embedding's."""

    def __init__(self, width: int, vocab: int, bias: bool = False, softcap: float | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, width) * 0.02)
        self.bias = nn.Parameter(torch.zeros(vocab)) if bias else None
        self.softcap = softcap

    blockir_context: ClassVar[frozenset[str]] = NOTHING

    def forward(self, x: Tensor, **ctx: object) -> Tensor:
        logits = F.linear(x, self.weight, self.bias)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]} -> {self.weight.shape[0]}, softcap={self.softcap}"


BRANCH_KINDS: dict[str, type[nn.Module]] = {
    "self_attention": SelfAttention,
    "cross_attention": CrossAttention,
    "mlp": MLP,
    "gated_mlp": GatedMLP,
}

# torch.fx.symbolic_trace records this as one call: its body reads shapes as Python values.
torch.fx.wrap("_split_heads")
