"""Writers for the decoders in LLaMA's layout and its variants: two Pre-LN updates per layer, RoPE attention and
a (gated) MLP, a final norm and a head (``*ForCausalLM``); Gemma's scaled embeddings, Gemma 2's four norms,
OLMo 2's post-norms and Phi-3's fused projections.
"""
from __future__ import annotations

import math
from typing import Callable

from blockir.importers.hf.text import (Config, Norm, attn_opts, causal_lm, decl, drop, every_nth, fail, header,
                                       num, rms, window)
from blockir.importers.hf.writer import register, writes


def llama_like(cls: str, prefix: str, qkv_bias: bool | str | None = None, qk_norm: bool = False,
               out_bias: bool | str | None = None, rope_style: str = "half", gated: bool = True,
               rope_f32: bool = False, mlp_bias: str = "mlp_bias", fused_mlp: bool = False,
               post_norms: tuple[str, str] | None = None,
               windows: Callable[[Config], list[str]] = window,
               partial: bool = False) -> Callable[[Config, str, bool], str]:
    """LLaMA's layout. ``qkv_bias``/``out_bias``: fixed by the class, read from a config key (a string), or
    (None) from ``attention_bias``; ``mlp_bias``: the key of the MLP's biases; ``gated=False``: a plain
    ``up_proj``/``down_proj`` MLP; ``fused_mlp``: one ``gate_up_proj``; ``post_norms``: the names of the norms on
    the attention and MLP outputs before each residual add (GLM-4); ``windows``: the window options of the layer
    types; ``partial``: the class's RoPE reads ``partial_rotary_factor`` (most turn every channel whatever it says)."""
    def write(c: Config, model_type: str, exact: bool) -> str:
        layer = f"{prefix}DecoderLayer"
        bias = c.get("attention_bias", False)
        if isinstance(qkv_bias, str):
            bias = c.get(qkv_bias, False)
        attn = no_rope(c, attn_opts(c, exact, partial=partial)) + windows(c)
        if rope_style != "half":
            attn.append(f"rope_style={rope_style}")
        if rope_f32:
            attn.append("rope_f32=true")
        if bias if qkv_bias is None or isinstance(qkv_bias, str) else qkv_bias:
            attn.append("bias=true")
        if c.get(out_bias, False) if isinstance(out_bias, str) else \
                (not isinstance(qkv_bias, bool) and bias) if out_bias is None else out_bias:
            attn.append("out_bias=true")
        if qk_norm:
            attn += ["qk_norm=rmsnorm", f"qk_norm_eps={num(c.get('rms_norm_eps', 1e-6))}"]
        mlp = ["F", f"act={c.act()}"] + (["bias=true"] if c.get(mlp_bias, False) else []) + \
            (["fused=true"] if fused_mlp else [])
        if not gated:
            mlp = ["F", f"act={c.act()}", f"bias={str(c.get(mlp_bias, False)).lower()}", "fc1=up_proj",
                   "fc2=down_proj"]
        n = c.norm()
        post_attn, post_mlp = post_norms or ("", "")
        update = drop(c.get("residual_dropout", 0.0))  # Seed-OSS drops each branch output
        lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
        attn_scale, res, emb, logits = multipliers(c, model_type)
        if attn_scale is not None:
            attn.append(f"scale={num(attn_scale)}")
        lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
                  f"  input_layernorm: {n}", decl("self_attn", "self_attention", attn),
                  *([f"  {post_attn}: {n}"] if post_attn else []),
                  f"  post_attention_layernorm: {n}", decl("mlp", "gated_mlp" if gated else "mlp", mlp),
                  *([f"  {post_mlp}: {n}"] if post_mlp else []),
                  f"  h = x + {update(_around(post_attn, 'self_attn(input_layernorm(x))'))}{res}",
                  f"  y = h + {update(_around(post_mlp, 'mlp(post_attention_layernorm(h))'))}{res}",
                  "  return y", "}", ""]
        model = causal_lm(cls, "model", layer, c)
        if emb or logits:
            model[-2] = f"  return {logits}lm_head(model.norm(model.layers(model.embed_tokens(input_ids){emb})))"
        return "\n".join(lines + model) + "\n"
    return write


def no_rope(c: Config, attn: list[str]) -> list[str]:
    """SmolLM3's ``no_rope_layers`` (HF reads one flag per layer, a prefix of the list): the layers flagged 0 rotate
    nothing, written as the rotated channels times an indicator in ``layer``."""
    layers = c.need("num_hidden_layers")
    flags = [bool(f) for f in (c.get("no_rope_layers") or [1] * layers)[:layers]]
    if all(flags):
        return attn
    periodic = every_nth(flags)
    if periodic is None:
        raise fail("this mix of layers with and without RoPE is not supported",
                   "supported: every layer, none, or all but every n-th layer", at=("no_rope_layers",))
    h = c.need("num_attention_heads")
    hd = c.get("head_dim") or c.need("hidden_size") // h
    kept = [o for o in attn if not o.startswith("rotary_dim=")]
    return kept + [f"rotary_dim={hd} * {periodic[1]}" if any(flags) else "rotary_dim=0"]


def _around(norm: str, branch: str) -> str:
    return f"{norm}({branch})" if norm else branch


def multipliers(c: Config, model_type: str) -> tuple[float | None, str, str, str]:
    """Granite's constants: attention scale, and the residual, embedding and logits factors as written (HyperCLOVA X
    multiplies the logits by logits_scaling, Granite divides them by it)."""
    if model_type not in ("granite", "granitemoe", "hyperclovax"):
        return None, "", "", ""
    logits = factor = float(c.get("logits_scaling", 1.0))
    if model_type != "hyperclovax":  # the Granite families divide
        mantissa, _ = math.frexp(logits)
        if mantissa != 0.5:  # 1 / logits is exact only for a power of two; the language has no tensor division
            raise fail(f"logits_scaling={num(logits)} is not a power of two", at=("logits_scaling",), hint="HF "
                       "divides the logits by it; blockir multiplies by the reciprocal, which equals only for powers "
                       "of two")
        factor = 1 / logits
    res = num(c.get("residual_multiplier", 1.0))
    emb = num(c.get("embedding_multiplier", 1.0))
    return (float(c.get("attention_multiplier", 1.0)), f" * {res}", f" * {emb}",
            "" if factor == 1 else f"{num(factor)} * ")


for _type, _write, _norm in (
        ("llama", llama_like("LlamaForCausalLM", "Llama"), rms()),
        ("internlm3", llama_like("LlamaForCausalLM", "Llama"), rms()),
        ("iquestcoder", llama_like("LlamaForCausalLM", "Llama"), rms()),
        ("exaone", llama_like("LlamaForCausalLM", "Llama"), rms()),
        ("mistral", llama_like("MistralForCausalLM", "Mistral", qkv_bias=False), rms()),
        ("qwen2", llama_like("Qwen2ForCausalLM", "Qwen2", qkv_bias=True), rms()),
        ("qwen3", llama_like("Qwen3ForCausalLM", "Qwen3", qk_norm=True), rms()),
        ("ministral", llama_like("MinistralForCausalLM", "Ministral", qkv_bias=False), rms()),
        ("seed_oss", llama_like("SeedOssForCausalLM", "SeedOss", out_bias="attention_out_bias"), rms()),
        ("arcee", llama_like("ArceeForCausalLM", "Arcee", gated=False), rms()),
        ("helium", llama_like("HeliumForCausalLM", "Helium", out_bias=False, rope_style="interleaved"),
         rms(cast="after_weight")),
        ("granite", llama_like("GraniteForCausalLM", "Granite"), rms()),
        ("smollm3", llama_like("SmolLM3ForCausalLM", "SmolLM3"), rms()),
        # GLM: interleaved rotary on the first half of each head (partial_rotary_factor), fused gate_up_proj
        ("glm", llama_like("GlmForCausalLM", "Glm", out_bias=False, rope_style="interleaved", fused_mlp=True,
                           partial=True), rms()),
        ("glm4", llama_like("Glm4ForCausalLM", "Glm4", out_bias=False, rope_style="interleaved", fused_mlp=True,
                            post_norms=("post_self_attn_layernorm", "post_mlp_layernorm"), partial=True), rms()),
        # ERNIE 4.5: every projection biased by use_bias; interleaved rotary on f32 tables
        ("ernie4_5", llama_like("Ernie4_5ForCausalLM", "Ernie4_5", qkv_bias="use_bias", out_bias="use_bias",
                                mlp_bias="use_bias", rope_style="interleaved", rope_f32=True), rms()),
        ("jais2", llama_like("Jais2ForCausalLM", "Jais2", gated=False),
         Norm("layernorm", "layer_norm_eps")),
        # Nemotron's LayerNorm1P scales by 1 + weight; partial rotary
        ("nemotron", llama_like("NemotronForCausalLM", "Nemotron", gated=False, partial=True),
         Norm("layernorm", "norm_eps", ("offset=1",))),
        # OLMo's LayerNorm has no parameters and no eps field, and runs on an f32 copy
        ("olmo", llama_like("OlmoForCausalLM", "Olmo", rope_f32=True),
         Norm("layernorm", 1e-5, ("affine=false", "upcast=true")))):
    register(_type, _write, _norm)


@writes("hyperclovax", norm=rms())
def _hyperclovax(c: Config, model_type: str, exact: bool) -> str:
    """Granite's layer and constants, with norms on the branch outputs (``use_post_norm``)."""
    post = ("post_norm1", "post_norm2") if c.get("use_post_norm", True) else None
    return llama_like("HyperCLOVAXForCausalLM", "HyperCLOVAX", post_norms=post)(c, model_type, exact)


@writes("gemma", norm=rms(offset=1, cast="after_weight"))
def _gemma(c: Config, model_type: str, exact: bool) -> str:
    cls, layer = "GemmaForCausalLM", "GemmaDecoderLayer"
    norm = c.norm()
    attn = attn_opts(c, exact) + (["bias=true", "out_bias=true"] if c.get("attention_bias", False) else [])
    mlp = ["F", f"act={c.act('hidden_act', 'gelu_pytorch_tanh')}"]
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", decl("self_attn", "self_attention", attn),
              f"  post_attention_layernorm: {norm}", decl("mlp", "gated_mlp", mlp),
              "  h = x + self_attn(input_layernorm(x))", "  y = h + mlp(post_attention_layernorm(h))",
              "  return y", "}", ""]
    return "\n".join(lines + causal_lm(cls, "model", layer, c, scale="D ** 0.5")) + "\n"


@writes("gemma2", norm=rms(offset=1, cast="after_weight"))
def _gemma2(c: Config, model_type: str, exact: bool) -> str:
    return sandwich_text("Gemma2ForCausalLM", "Gemma2DecoderLayer", model_type, c, _gemma2_attn(c, exact))


@writes("vaultgemma", norm=rms(offset=1, cast="after_weight"))
def _vaultgemma(c: Config, model_type: str, exact: bool) -> str:
    """Gemma 2 without the norms on the branch outputs."""
    return sandwich_text("VaultGemmaForCausalLM", "VaultGemmaDecoderLayer", model_type, c,
                         _gemma2_attn(c, exact), post=False)


def _gemma2_attn(c: Config, exact: bool) -> list[str]:
    attn = attn_opts(c, exact) + window(c) + [f"scale={num(float(c.get('query_pre_attn_scalar', 256)) ** -0.5)}"]
    if c.get("attn_logit_softcapping") is not None:
        attn.append(f"softcap={num(c.get('attn_logit_softcapping'))}")
    return attn


def sandwich_text(cls: str, layer: str, model_type: str, c: Config, attn: list[str], post: bool = True) -> str:
    """A Gemma 2-style file: four (1 + w) RMSNorms around each branch (``post=False``: the two before them only), a
    gated MLP, embeddings times sqrt(D), a tied head and soft-capped logits; ``attn`` holds the attention options
    of the family."""
    norm = c.norm()
    if c.get("attention_bias", False):
        attn += ["bias=true", "out_bias=true"]
    mlp = ["F", f"act={c.act('hidden_activation', 'gelu_pytorch_tanh')}"]
    after_attn, after_mlp = ("post_attention_layernorm", "post_feedforward_layernorm") if post else ("", "")
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", decl("self_attn", "self_attention", attn),
              *([f"  {after_attn}: {norm}"] if post else []), f"  pre_feedforward_layernorm: {norm}",
              decl("mlp", "gated_mlp", mlp), *([f"  {after_mlp}: {norm}"] if post else []),
              f"  h = x + {_around(after_attn, 'self_attn(input_layernorm(x))')}",
              f"  y = h + {_around(after_mlp, 'mlp(pre_feedforward_layernorm(h))')}", "  return y", "}", ""]
    return "\n".join(lines + causal_lm(cls, "model", layer, c, scale="D ** 0.5",
                                       softcap=c.get("final_logit_softcapping"))) + "\n"


@writes("olmo2", norm=rms(cast="after_weight"))
def _olmo2(c: Config, model_type: str, exact: bool) -> str:
    return post_norm_text("Olmo2ForCausalLM", "Olmo2DecoderLayer", model_type, c,
                          attn_opts(c, exact) + window(c) + olmo_qk(c))


def olmo_qk(c: Config) -> list[str]:
    """OLMo 2's attention options: f32 rotary tables, q/k RMSNorms over all heads."""
    return ["rope_f32=true", "qk_norm=rmsnorm", "qk_norm_axis=width", "qk_norm_cast=after_weight",
            f"qk_norm_eps={num(c.get('rms_norm_eps', 1e-6))}"]


def post_norm_text(cls: str, layer: str, model_type: str, c: Config, attn: list[str]) -> str:
    """An OLMo 2-style file: norms on the branch outputs only, a gated MLP; ``attn`` holds the attention options
    of the family."""
    norm = c.norm()
    if c.get("attention_bias", False):
        attn += ["bias=true", "out_bias=true"]
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              decl("self_attn", "self_attention", attn), f"  post_attention_layernorm: {norm}",
              decl("mlp", "gated_mlp", ["F", f"act={c.act()}"]), f"  post_feedforward_layernorm: {norm}",
              "  h = x + post_attention_layernorm(self_attn(x))", "  y = h + post_feedforward_layernorm(mlp(h))",
              "  return y", "}", ""]
    return "\n".join(lines + causal_lm(cls, "model", layer, c)) + "\n"


@writes("phi3", norm=rms())
def _phi3(c: Config, model_type: str, exact: bool) -> str:
    cls, layer = "Phi3ForCausalLM", "Phi3DecoderLayer"
    norm = c.norm()
    attn = attn_opts(c, exact, partial=True) + window(c) + ["fused=stacked"]
    if c.rope()["rope_type"] == "longrope":  # its generation recomputes the sequence when it switches factors
        attn.append("rope_recache=true")
    mlp = ["F", f"act={c.act()}", "fused=true"]
    update = drop(c.get("resid_pdrop", 0.0))
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", decl("self_attn", "self_attention", attn),
              f"  post_attention_layernorm: {norm}", decl("mlp", "gated_mlp", mlp),
              f"  h = x + {update('self_attn(input_layernorm(x))')}",
              f"  y = h + {update('mlp(post_attention_layernorm(h))')}",
              "  return y", "}", ""]
    return "\n".join(lines + causal_lm(cls, "model", layer, c)) + "\n"
