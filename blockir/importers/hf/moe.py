"""Writers for the mixture-of-experts decoders: LLaMA's layout with a ``moe`` branch in place of the MLP.

Mixtral renormalises the top-k routing weights and scales the experts by them in f32; Qwen2-MoE,
Qwen3-MoE and OLMoE renormalise only with ``norm_topk_prob`` and round the weights to the input dtype
first; GraniteMoE takes the softmax of the top-k logits, inside Granite's multipliers. Qwen2-MoE adds a
shared expert behind a sigmoid gate, Qwen3-MoE normalises each query and key head, OLMoE the whole query
and key widths. Every layer is sparse: the dense layers ``mlp_only_layers``
and ``decoder_sparse_step`` ask for are refused.
"""
from __future__ import annotations

from blockir.importers.hf.llama import multipliers
from blockir.importers.hf.text import Config, attn_opts, causal_lm, decl, fail, header, num, rms, window
from blockir.importers.hf.writer import writes


def _all_sparse(c: Config) -> None:
    if c.get("decoder_sparse_step", 1) != 1:
        raise fail(f"decoder_sparse_step={c.get('decoder_sparse_step')} (dense MLP layers between the sparse ones) "
                   "is not supported", "supported: decoder_sparse_step=1, every layer a mixture of experts",
                   at=("decoder_sparse_step",))
    if c.get("mlp_only_layers", []):
        raise fail("dense MLP layers (mlp_only_layers) are not supported",
                   "supported: mlp_only_layers=[], every layer a mixture of experts", at=("mlp_only_layers",))


def _text(cls: str, layer: str, model_type: str, c: Config, attn: list[str], moe: list[str],
          dims: dict[str, int], branch: str = "mlp") -> str:
    n = c.norm()
    attn_scale, res, emb, logits = multipliers(c, model_type)
    if attn_scale is not None:
        attn = attn + [f"scale={num(attn_scale)}"]
    lines = header(cls, model_type, c, {**dims, "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {n}", decl("self_attn", "self_attention", attn),
              f"  post_attention_layernorm: {n}", decl(branch, "moe", moe),
              f"  h = x + self_attn(input_layernorm(x)){res}", f"  y = h + {branch}(post_attention_layernorm(h)){res}",
              "  return y", "}", ""]
    model = causal_lm(cls, "model", layer, c)
    if emb or logits:
        model[-2] = f"  return {logits}lm_head(model.norm(model.layers(model.embed_tokens(input_ids){emb})))"
    return "\n".join(lines + model) + "\n"


def _routing(c: Config, experts: str, norm_topk: bool, weights: str) -> list[str]:
    return ["F", f"experts={c.need(experts)}", f"top_k={c.need('num_experts_per_tok')}", f"act={c.act()}"] + \
        (["norm_topk=true"] if norm_topk else []) + ([f"weights={weights}"] if weights != "f32" else [])


@writes("mixtral", norm=rms())
def _mixtral(c: Config, model_type: str, exact: bool) -> str:
    attn = attn_opts(c, exact) + window(c)
    return _text("MixtralForCausalLM", "MixtralDecoderLayer", model_type, c, attn,
                 _routing(c, "num_local_experts", True, "f32"), {"F": c.need("intermediate_size")})


@writes("qwen2_moe", norm=rms())
def _qwen2_moe(c: Config, model_type: str, exact: bool) -> str:
    _all_sparse(c)
    attn = attn_opts(c, exact) + window(c) + (["bias=true"] if c.get("qkv_bias", True) else [])
    moe = _routing(c, "num_experts", c.get("norm_topk_prob", False), "input") + ["shared=G", "shared_gate=true"]
    return _text("Qwen2MoeForCausalLM", "Qwen2MoeDecoderLayer", model_type, c, attn, moe,
                 {"F": c.need("moe_intermediate_size"), "G": c.need("shared_expert_intermediate_size")})


@writes("qwen3_moe", norm=rms())
def _qwen3_moe(c: Config, model_type: str, exact: bool) -> str:
    _all_sparse(c)
    attn = attn_opts(c, exact) + window(c) + ["qk_norm=rmsnorm", f"qk_norm_eps={num(c.get('rms_norm_eps', 1e-6))}"]
    if c.get("attention_bias", False):
        attn += ["bias=true", "out_bias=true"]
    return _text("Qwen3MoeForCausalLM", "Qwen3MoeDecoderLayer", model_type, c, attn,
                 _routing(c, "num_local_experts", c.get("norm_topk_prob", False), "input"),
                 {"F": c.need("moe_intermediate_size")})


@writes("olmoe", norm=rms())
def _olmoe(c: Config, model_type: str, exact: bool) -> str:
    attn = attn_opts(c, exact) + ["qk_norm=rmsnorm", "qk_norm_axis=width",
                                              f"qk_norm_eps={num(c.get('rms_norm_eps', 1e-5))}"]
    if c.get("attention_bias", False):
        attn += ["bias=true", "out_bias=true"]
    return _text("OlmoeForCausalLM", "OlmoeDecoderLayer", model_type, c, attn,
                 _routing(c, "num_experts", c.get("norm_topk_prob", False), "input"),
                 {"F": c.need("intermediate_size")})


@writes("granitemoe", norm=rms())
def _granitemoe(c: Config, model_type: str, exact: bool) -> str:
    """Granite's multipliers around Mixtral's layout; the router takes the top-k logits, then their softmax."""
    attn = attn_opts(c, exact) + (["bias=true", "out_bias=true"] if c.get("attention_bias", False) else [])
    moe = _routing(c, "num_local_experts", False, "input") + ["routing=topk_softmax", "router=router"]
    return _text("GraniteMoeForCausalLM", "GraniteMoeDecoderLayer", model_type, c, attn, moe,
                 {"F": c.need("intermediate_size")}, branch="block_sparse_moe")
