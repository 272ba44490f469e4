"""GPT-J's and CodeGen's writer: a ``gptj`` or ``codegen`` config → the `.block` text of its ``*ForCausalLM``.

GPT-J ("GPT-J-6B: A 6 Billion Parameter Autoregressive Language Model", Wang and Komatsuzaki, 2021)
rotates the first ``rotary_dim`` coordinates of each head pairwise (``2i`` with ``2i + 1``), runs
attention and MLP in parallel from one ``ln_1``, and has a biased head. Its sin/cos table is a
buffer built in fp32 that ``model.to(dtype)`` rounds, which is what ``rope_freqs=f32`` computes.
CodeGen ("CodeGen: An Open Large Language Model for Code with Multi-Turn Program Synthesis",
arXiv:2203.13474) is GPT-J with one ``qkv_proj`` whose rows come in four groups, each holding q,
then v, then k of a quarter of the heads (``fused=qvk_groups, qkv_groups=4``).
"""
from __future__ import annotations

from blockir.importers.hf.text import Config, Norm, decl, drop, exact_impl, fail, header, no_embedding_dropout, num
from blockir.importers.hf.writer import writes


@writes("gptj", "codegen", norm=Norm("layernorm", "layer_norm_epsilon"))
def _gptj(c: Config, model_type: str, exact: bool) -> str:
    cls, layer = ("GPTJForCausalLM", "GPTJBlock") if model_type == "gptj" else ("CodeGenForCausalLM", "CodeGenBlock")
    d, heads = c.get("n_embd", c.get("hidden_size")), c.get("n_head", c.get("num_attention_heads"))
    c.raw.update(hidden_size=d)
    norm = c.norm()
    attn = [f"heads={heads}", "rope=true", "rope_theta=10000", "rope_style=interleaved", "o=out_proj"]
    rotary = c.get("rotary_dim")
    if rotary and rotary != d // heads:
        attn.append(f"rotary_dim={rotary}")
    if model_type == "codegen" and heads % 4:
        raise fail(f"CodeGen's fused qkv_proj splits the heads into 4 groups: n_head={heads} is not a multiple of 4",
                       at=("n_head",))
    if model_type == "codegen":  # HF's fixed model-parallel split of the fused projection
        attn += ["fused=qvk_groups", "qkv_groups=4", "qkv=qkv_proj"]
    if c.get("attn_pdrop", 0.0):
        attn.append(f"dropout={num(c.get('attn_pdrop'))}")
    attn += exact_impl(c, cached=True) + ["scores_f32=true"] if exact else []
    update = drop(c.get("resid_pdrop", 0.0))
    mlp = ["F", f"act={c.act('activation_function', 'gelu_new')}", "fc1=fc_in", "fc2=fc_out"]
    lines = header(cls, model_type, c, {"D": d, "F": c.get("n_inner") or 4 * d,
                                            "L": c.get("n_layer", c.get("num_hidden_layers"))})
    # one norm output feeds both branches; HF runs attention first and sums attention + MLP + residual
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{", f"  ln_1: {norm}",
              decl("attn", "self_attention", attn), decl("mlp", "mlp", mlp),
              "  n = ln_1(x)", f"  a = {update('attn(n)')}", f"  m = {update('mlp(n)')}", "  y = a + m + x",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              "  transformer.wte: embedding(V, D)", f"  transformer.h: {layer} * L",
              f"  transformer.ln_f: {norm}",
              decl("lm_head", "head", ["V", "bias=true"] + (["tied=true"] if c.get("tie_word_embeddings") else [])),
              "  x = " + no_embedding_dropout(c, "embd_pdrop") + "transformer.wte(input_ids)",
              "  return lm_head(transformer.ln_f(transformer.h(x)))", "}"]
    return "\n".join(lines) + "\n"

