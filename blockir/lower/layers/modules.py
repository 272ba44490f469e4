"""Declarations → torch modules and parameters, named so state_dict keys equal the declared names."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping

import torch
from torch import nn

from blockir.analyses.key_roles import head_aliases
from blockir.analyses.sizes import Sizes
from blockir.lower.layers import branches, numerics, rotary
from blockir.lower.layers.norm_module import norm_factory
from blockir.lower.bind import Binding, BoundExtern
from blockir.diagnostics import BlockError, error
from blockir.ir import init_roles
from blockir.ir.decls import ExternDecl, KindDecl
from blockir.ir.kinds import layer_names
from blockir.ir.program import Block
from blockir.ir.types import TensorType


class Activation(nn.Module):
    """A declared activation; holds no state."""

    def __init__(self, fn: str) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return numerics.ACTIVATIONS[self.fn](x)

    def extra_repr(self) -> str:
        return self.fn


def _opt_int(s: Sizes, d: KindDecl, name: str) -> int | None:
    v = d.arg(name)
    return int(s.value(v)) if v is not None else None


@dataclass(frozen=True)
class BranchInit:
    """The per-role init a branch declaration states (``init_std``, ``init_gain``, ``init_scale``, ``init_zero``)."""

    kind: str
    fan_in: bool
    gain: float | None
    scale: float | None
    zero: bool

    @classmethod
    def of(cls, d: KindDecl, s: Sizes) -> BranchInit | None:
        gain, scale = _opt_float(s, d, "init_gain"), _opt_float(s, d, "init_scale")
        fan_in, zero = d.arg("init_std") == "fan_in", bool(d.arg("init_zero"))
        return cls(d.kind, fan_in, gain, scale, zero) if fan_in or zero or gain is not None or scale is not None \
            else None

    def __call__(self, module: nn.Module) -> None:
        names: dict[str, str] = getattr(module, "names")

        def layers(roles: tuple[str, ...]) -> list[nn.Linear]:
            # a fused layout has no separate q/k/v or gate/up matrices
            return [m for r in roles if (m := getattr(module, names.get(r, ""), None)) is not None]
        with torch.no_grad():
            if self.fan_in:
                rectified = {id(m) for m in layers(init_roles.RECTIFIED.get(self.kind, ()))}
                for m in module.children():
                    if isinstance(m, nn.Linear):
                        m.weight.normal_(0.0, ((2.0 if id(m) in rectified else 1.0) / m.weight.shape[1]) ** 0.5)
                        if m.bias is not None:
                            m.bias.zero_()
            if self.gain is not None:
                for roles, g in ((init_roles.UNGAINED.get(self.kind, ()), 1.0), (init_roles.GAINED[self.kind],
                                                                                  self.gain)):
                    for m in layers(roles):
                        nn.init.xavier_normal_(m.weight, gain=g)
            if self.scale is not None:
                for m in layers(init_roles.EARLIER[self.kind]):
                    m.weight.mul_(self.scale)
            if self.zero:
                for m in layers((init_roles.LAST[self.kind],)):
                    m.weight.zero_()
                    if m.bias is not None:
                        m.bias.zero_()


def _initialised_table(build: Callable[[], nn.Module], std: float | None, gain: float | None) -> nn.Module:
    """An embedding drawn from N(0, std^2) when ``std`` is given, then multiplied by ``gain`` (T-Fixup)."""
    module = build()
    with torch.no_grad():
        if std is not None:
            module.weight.normal_(0.0, std)
        if gain is not None:
            module.weight.mul_(gain)
    return module


def _opt_float(s: Sizes, d: KindDecl, name: str) -> float | None:
    v = d.arg(name)
    return float(s.value(v)) if v is not None else None


def _rope_scaling(d: KindDecl, s: Sizes) -> rotary.RopeScaling | None:
    kind = d.arg("rope_scaling")
    if kind is None:
        return None
    given = {field: _opt_float(s, d, arg) for field, arg in (
        ("low_freq", "rope_low_freq"), ("high_freq", "rope_high_freq"), ("beta_fast", "rope_beta_fast"),
        ("beta_slow", "rope_beta_slow"), ("attention_factor", "rope_attention_factor"))}
    lists = {field: tuple(float(v) for v in d.arg(arg)) for field, arg in (
        ("short_factor", "rope_short_factor"), ("long_factor", "rope_long_factor")) if d.arg(arg) is not None}
    return rotary.RopeScaling(kind, float(s.value(d.arg("rope_factor"))), _opt_int(s, d, "rope_original_max"),
                              **{k: v for k, v in given.items() if v is not None}, **lists)


def _attention(d: KindDecl, width: int, s: Sizes) -> Callable[[], nn.Module]:
    core = dict(
        causal=d.kind == "self_attention" and d.arg("causal"), window=_opt_int(s, d, "window") or None,
        scale=_opt_float(s, d, "scale"), softcap=_opt_float(s, d, "softcap"),
        dropout=float(s.value(d.arg("dropout"))), impl=d.arg("impl"), softmax_f32=d.arg("softmax_f32"),
        kv_cache=bool(d.arg("kv_cache")), scores_f32=bool(d.arg("scores_f32")),
        score_residual=d.arg("score_residual"), scale_query=d.arg("scale_query"),
        divide_scores=bool(d.arg("divide_scores")))
    if d.arg("score_count") is not None:
        core["score_count"] = int(s.value(d.arg("score_count")))
    kw: dict[str, Any] = dict(heads=int(s.value(d.arg("heads"))), kv_heads=_opt_int(s, d, "kv_heads"),
                              head_dim=_opt_int(s, d, "head_dim"), bias=d.arg("bias"), out_bias=d.arg("out_bias"),
                              name=f"{d.kind} '{d.name}'", span=d.span, fused=d.arg("fused"), conv1d=d.arg("conv1d"),
                              names=layer_names(d.kind, dict(d.args)), qk_norm=d.arg("qk_norm"),
                              qk_norm_axis=d.arg("qk_norm_axis"), qk_norm_eps=float(s.value(d.arg("qk_norm_eps"))),
                              qk_norm_cast=d.arg("qk_norm_cast"), qk_scale=bool(d.arg("qk_scale")),
                              qk_norm_offset=_opt_int(s, d, "qk_norm_offset") or 0,
                              qkv_groups=_opt_int(s, d, "qkv_groups") or 1,
                              head_scale=bool(d.arg("head_scale")), fixup_bias=bool(d.arg("fixup_bias")))
    if d.kind == "self_attention":
        kw.update(causal=d.arg("causal"), rope=d.arg("rope"), rope_theta=float(s.value(d.arg("rope_theta"))),
                  rope_style=d.arg("rope_style"), rotary_dim=_opt_int(s, d, "rotary_dim"),
                  rope_freqs=d.arg("rope_freqs") or "f32", rope_f32=bool(d.arg("rope_f32")),
                  rope_scaling=_rope_scaling(d, s), alibi=d.arg("alibi"), rope_tables=d.arg("rope_tables") or "f32",
                  kv_broadcast=bool(d.arg("kv_broadcast")), rope_recache=bool(d.arg("rope_recache")))
    cls = branches.SelfAttention if d.kind == "self_attention" else branches.CrossAttention
    # each module gets its own core
    return lambda: cls(width, core=branches.AttentionCore(**core), **kw)


def _branch(d: KindDecl, width: int, s: Sizes) -> Callable[[], nn.Module]:
    if d.kind in ("self_attention", "cross_attention"):
        return _attention(d, width, s)
    names = layer_names(d.kind, dict(d.args))
    if d.kind == "mlp":
        return partial(branches.MLP, width, s.dim(d.arg("hidden")), act=d.arg("act"), bias=d.arg("bias"),
                       conv1d=d.arg("conv1d"), fixup_bias=bool(d.arg("fixup_bias")), **names)
    if d.kind == "moe":
        return partial(branches.MoE, width, s.dim(d.arg("hidden")), int(s.value(d.arg("experts"))),
                       int(s.value(d.arg("top_k"))), act=d.arg("act"), routing=d.arg("routing"),
                       norm_topk=d.arg("norm_topk"), weights=d.arg("weights"),
                       shared=s.dim(d.arg("shared")) if d.arg("shared") is not None else None,
                       shared_gate=d.arg("shared_gate"), **names)
    return partial(branches.GatedMLP, width, s.dim(d.arg("hidden")), act=d.arg("act"), bias=d.arg("bias"),
                   fused=d.arg("fused"), fixup_bias=bool(d.arg("fixup_bias")), **names)


def kind_factory(d: KindDecl, input_type: TensorType | None, s: Sizes) -> Callable[[], nn.Module | nn.Parameter]:
    """The constructor of one declaration's module (or bare parameter), its arguments evaluated now.

    Each call builds fresh state; the fx lowering calls one factory for every layer of a stack
    whose sizes agree, so a deep stack evaluates each declaration's arguments once.
    """
    # an embedding reads token ids, whose last axis is the sequence: it takes its width from its arguments
    width = s.axis(input_type.axes[-1]) if input_type is not None and input_type.axes and \
        d.kind != "embedding" else None
    if d.category == "norm":
        return norm_factory(d, s.dim(d.arg("axes")[-1]), s.value)
    if d.kind == "linear":
        return partial(nn.Linear, s.dim(d.arg("in_dim")), s.dim(d.arg("out_dim")), bias=d.arg("bias"))
    if d.kind == "embedding":
        table = partial(branches.Embedding, s.dim(d.arg("vocab")), s.dim(d.arg("width")),
                        positions=d.arg("positions"), scale=_opt_float(s, d, "scale"),
                        offset=_opt_int(s, d, "position_offset") or 0, mask_positions=d.arg("mask_positions"),
                        padding_idx=_opt_int(s, d, "padding_idx"))
        std, gain = _opt_float(s, d, "init_std"), _opt_float(s, d, "init_gain")
        return table if std is None and gain is None else partial(_initialised_table, table, std, gain)
    if d.kind == "head" and width is not None:
        return partial(branches.Head, width, s.dim(d.arg("vocab")), bias=d.arg("bias"),
                       softcap=_opt_float(s, d, "softcap"))
    if d.category in ("scale", "shift"):
        # init is the initial gain; with offset=1 the stored deviation starts at init - 1
        init = float(s.value(d.arg("init"))) - d.arg("offset", 0)
        shape = (s.dim(d.arg("axis")),) if d.arg("axis") is not None else ()
        return lambda: nn.Parameter(torch.full(shape, init))
    if d.kind == "activation":
        return partial(Activation, d.arg("fn"))
    if width is None:
        raise BlockError([error("E0703", f"'{d.name}' is declared but never applied, so its width is unknown", d.span)])
    build, init = _branch(d, width, s), BranchInit.of(d, s)
    if init is None:
        return build

    def initialised() -> nn.Module:
        module = build()
        init(module)
        return module
    return initialised


def make_kind(d: KindDecl, input_type: TensorType | None, s: Sizes) -> nn.Module | nn.Parameter:
    """Build the module (or bare parameter, for learned scales) of one declaration."""
    return kind_factory(d, input_type, s)()


def tie_heads(module: nn.Module, block: Block) -> None:
    """Give every head of ``block`` the tensors it shares (``head_aliases``): one tensor under two names.

    The state dict then holds the tensor under both names, and ``load_state_dict`` (strict or not)
    accepts a checkpoint that stores either name or both: a load-time hook copies the one given to
    the one omitted. Given both, each is copied into the one shared tensor in declaration order, so the
    later declaration's tensor is the one kept.
    """
    pairs = head_aliases(block)
    for source, alias in pairs:
        owner, _, attr = alias.rpartition(".")
        setattr(module.get_submodule(owner), attr, module.get_parameter(source))
    if pairs:
        module.register_load_state_dict_pre_hook(partial(_fill_alias, pairs))


def _fill_alias(pairs: tuple[tuple[str, str], ...], module: nn.Module, state_dict: dict[str, Any],
                prefix: str, *_: Any) -> None:
    """Load-time hook: a tied table stored under one of its two names is loaded under the other as well."""
    for source, alias in pairs:
        a, b = prefix + source, prefix + alias
        if a in state_dict and b not in state_dict:
            state_dict[b] = state_dict[a]
        elif b in state_dict and a not in state_dict:
            state_dict[a] = state_dict[b]


def bound_extern(d: ExternDecl, bind: Mapping[str, Binding], s: Sizes) -> BoundExtern:
    """The branch of an extern: its binding (checked by compile) called through the adapter."""
    module, adapter = bind[d.name]
    return BoundExtern(d, module, adapter, s)
