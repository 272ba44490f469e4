"""Writers for model types whose layers repeat a period of sliding-window layers and one full layer.

``layer_types`` is written as an indicator expression in ``layer`` (constant expressions have ``%``
and ``//``), so one block serves every layer: ``((layer + 1) % 6 + 5) // 6`` is 1 on the sliding
layers of Gemma 3 and 0 on every sixth. Options that differ by layer type (the window, Gemma 3's
local RoPE base, Cohere 2's RoPE on sliding layers only) are written as that indicator times the
difference.
"""
from __future__ import annotations

from blockir.importers.hf.gpt import COHERE_NORM
from blockir.importers.hf.llama import llama_like, olmo_qk, post_norm_text, sandwich_text
from blockir.importers.hf.text import Config, attn_opts, causal_lm, decl, fail, header, num, rms
from blockir.importers.hf.writer import register, writes


def _period(c: Config) -> tuple[int, str]:
    """The period of ``layer_types`` (one full layer in each, at the same place) and its sliding-layer indicator."""
    types = c.get("layer_types") or []
    sliding = [t == "sliding_attention" for t in types]
    for period in range(1, len(types) + 2):
        for shift in range(1, period + 1):  # 1: the last layer of each period is full (Gemma 3); period: the first
            if sliding == [(i + shift) % period != 0 for i in range(len(types))]:
                if period == 1:
                    return 1, "0"
                return period, f"(((layer + {shift}) % {period} + {period - 1}) // {period})"
    raise fail("this mix of sliding and full attention layers is not supported",
                "supported: every n-th layer full, the others sliding", at=("layer_types",))


def _mixed(value_sliding: float, value_full: float, indicator: str) -> str:
    """A per-layer value: ``value_sliding`` where the indicator is 1, ``value_full`` where it is 0."""
    if value_sliding == value_full or indicator == "0":
        return num(value_full)
    if value_full == 0:
        return f"{num(value_sliding)} * {indicator}"
    return f"{num(value_full)} - {num(value_full - value_sliding)} * {indicator}"


def _rope_by_type(c: Config) -> tuple[dict, dict]:
    """The RoPE parameters of sliding and full layers (a dict per layer type, or one for both)."""
    params = c.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    else:
        full = local = params
    for p in (full, local):
        if p.get("rope_type", "default") != "default":
            raise fail(f"RoPE scaling type '{p.get('rope_type')}' per layer type is not supported",
                        "supported: default", at=("rope_parameters",))
    return local, full


@writes("gemma3_text", norm=rms(offset=1, cast="after_weight"))
def _gemma3_text(c: Config, model_type: str, exact: bool) -> str:
    cls, layer = "Gemma3ForCausalLM", "Gemma3DecoderLayer"
    period, sliding = _period(c)
    local, full = _rope_by_type(c)
    theta = _mixed(local.get("rope_theta", c.get("rope_local_base_freq", 10000.0)),
                   full.get("rope_theta", c.get("rope_theta", 1e6)), sliding)
    c.raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 1.0}  # the base is written per layer below
    attn = [o for o in attn_opts(c, exact) if not o.startswith("rope_theta=")] + [f"rope_theta={theta}"]
    if c.get("sliding_window") and period != 1:
        attn.append(f"window={_mixed(c.get('sliding_window'), 0, sliding)}")
    attn += [f"scale={num(float(c.get('query_pre_attn_scalar', 256)) ** -0.5)}", "qk_norm=rmsnorm",
             "qk_norm_cast=after_weight", "qk_norm_offset=1", f"qk_norm_eps={num(c.get('rms_norm_eps', 1e-6))}"]
    if c.get("attn_logit_softcapping") is not None:
        attn.append(f"softcap={num(c.get('attn_logit_softcapping'))}")
    return sandwich_text(cls, layer, model_type, c, attn)


@writes("cohere2", norm=COHERE_NORM)
def _cohere2(c: Config, model_type: str, exact: bool) -> str:
    """Cohere 2: Cohere's parallel layer, with RoPE and a window on the sliding layers only."""
    cls, layer = "Cohere2ForCausalLM", "Cohere2DecoderLayer"
    _, sliding = _period(c)
    norm = c.norm()
    h = c.need("num_attention_heads")
    hd = c.get("head_dim") or c.need("hidden_size") // h
    attn = attn_opts(c, exact) + ["rope_style=interleaved", "rope_f32=true", "rope_tables=input"]
    # every channel rotates on sliding layers, none on full ones; HF's layers rotate only with a window
    rotated = hd if c.get("sliding_window") else 0
    attn = [o for o in attn if not o.startswith("rotary_dim=")] + [f"rotary_dim={_mixed(rotated, 0, sliding)}"]
    attn += _windows(c)
    if c.get("attention_bias", False):
        attn += ["bias=true", "out_bias=true"]
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{", f"  input_layernorm: {norm}",
              decl("self_attn", "self_attention", attn), decl("mlp", "gated_mlp", ["F", f"act={c.act()}"]),
              "  n = input_layernorm(x)", "  a = self_attn(n)", "  m = mlp(n)", "  y = x + a + m",
              "  return y", "}", ""]
    model = causal_lm(cls, "model", layer, c)
    model[-2] = (f"  return {num(c.get('logit_scale', 0.0625))} * "
                 "lm_head(model.norm(model.layers(model.embed_tokens(input_ids))))")
    return "\n".join(lines + model) + "\n"


def _windows(c: Config) -> list[str]:
    """The window of the sliding layers of the period, none on its full layer."""
    period, sliding = _period(c)
    return [f"window={_mixed(c.get('sliding_window'), 0, sliding)}"] if c.get("sliding_window") and period != 1 else []


@writes("olmo3", norm=rms(cast="after_weight"))
def _olmo3(c: Config, model_type: str, exact: bool) -> str:
    """OLMo 3: OLMo 2's layer, a period of ``layer_types`` and a RoPE base per layer type."""
    _, sliding = _period(c)
    local, full = _rope_by_type(c)
    theta = _mixed(local.get("rope_theta", 500000.0), full.get("rope_theta", 500000.0), sliding)
    c.raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 1.0}  # the base is written per layer below
    attn = [o for o in attn_opts(c, exact) if not o.startswith("rope_theta=")] + [f"rope_theta={theta}"]
    return post_norm_text("Olmo3ForCausalLM", "Olmo3DecoderLayer", model_type, c, attn + _windows(c) + olmo_qk(c))


@writes("exaone4", norm=rms())
def _exaone4(c: Config, model_type: str, exact: bool) -> str:
    """EXAONE 4: OLMo 2's layer with per-head q/k RMSNorms; given a window, RoPE and the window on the sliding
    layers of the period only."""
    attn = attn_opts(c, exact)
    if c.get("sliding_window"):
        _, sliding = _period(c)
        rotated = c.get("head_dim") or c.need("hidden_size") // c.need("num_attention_heads")
        attn += [f"rotary_dim={_mixed(rotated, 0, sliding)}"] + _windows(c)
    attn += ["qk_norm=rmsnorm", f"qk_norm_eps={num(c.get('rms_norm_eps', 1e-5))}"]
    return post_norm_text("Exaone4ForCausalLM", "Exaone4DecoderLayer", model_type, c, attn)


# CWM: LLaMA's layer without biases, its first layer of every period full
register("cwm", llama_like("CwmForCausalLM", "Cwm", qkv_bias=False, windows=_windows), rms())
