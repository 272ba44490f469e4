"""The tiny configs the importer tests build HF models from, one or more per supported model type (no torch here:
the schema and fuzz tests read them without building models)."""
from __future__ import annotations

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64)
MOE = dict(COMMON, hidden_size=32, intermediate_size=48, num_key_value_heads=2, num_experts_per_tok=2,
           experts_implementation="eager")
CONFIGS: dict[str, dict] = {
    "llama": dict(COMMON, model_type="llama", num_key_value_heads=2, attention_bias=True, rms_norm_eps=1e-5),
    "mistral": dict(COMMON, model_type="mistral", num_key_value_heads=1, sliding_window=5),
    "qwen2": dict(COMMON, model_type="qwen2", num_key_value_heads=2, tie_word_embeddings=True),
    "qwen3": dict(COMMON, model_type="qwen3", num_key_value_heads=2, head_dim=8),
    "gemma": dict(COMMON, model_type="gemma", num_key_value_heads=2, head_dim=16),
    "olmo2": dict(COMMON, model_type="olmo2", num_key_value_heads=2),
    "phi3": dict(COMMON, model_type="phi3", num_key_value_heads=2, partial_rotary_factor=0.5, pad_token_id=0),
    "gpt2": dict(model_type="gpt2", vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=32),
    "gpt_neox": dict(COMMON, model_type="gpt_neox", rotary_pct=0.25, use_parallel_residual=True),
    "helium": dict(COMMON, model_type="helium", num_key_value_heads=2, head_dim=16, attention_bias=True,
                   pad_token_id=3),
    "granite": dict(COMMON, model_type="granite", num_key_value_heads=2, embedding_multiplier=12.0,
                    residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=8.0),
    "smollm3": dict(COMMON, model_type="smollm3", num_key_value_heads=2, pad_token_id=2),
    "olmo": dict(COMMON, model_type="olmo", num_key_value_heads=2, pad_token_id=1),
    "starcoder2": dict(COMMON, model_type="starcoder2", num_key_value_heads=2, sliding_window=4),
    "stablelm": dict(COMMON, model_type="stablelm", num_key_value_heads=2, use_qkv_bias=True, pad_token_id=0),
    "stablelm-parallel": dict(COMMON, model_type="stablelm", num_key_value_heads=4, use_parallel_residual=True, partial_rotary_factor=0.5),
    "phi": dict(COMMON, model_type="phi", partial_rotary_factor=0.5, pad_token_id=1),
    "cohere": dict(COMMON, model_type="cohere", num_key_value_heads=2, logit_scale=0.125, pad_token_id=0),
    "gemma2": dict(COMMON, model_type="gemma2", num_hidden_layers=3, num_key_value_heads=2, head_dim=16, sliding_window=3,
                   query_pre_attn_scalar=24, attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    "ministral": dict(COMMON, model_type="ministral", num_key_value_heads=2, head_dim=16, sliding_window=4),
    "seed_oss": dict(COMMON, model_type="seed_oss", num_key_value_heads=2, head_dim=16, attention_bias=True,
                     attention_out_bias=False, pad_token_id=2),
    "arcee": dict(COMMON, model_type="arcee", num_key_value_heads=2, pad_token_id=0),
    "gptj": dict(model_type="gptj", vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=64, rotary_dim=8,
                 bos_token_id=1, eos_token_id=1),
    "codegen": dict(model_type="codegen", vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=64, n_ctx=64,
                    rotary_dim=8, bos_token_id=1, eos_token_id=1),
    # a period of sliding layers and one full layer: layer 5 of 7 and layer 3 of 5 are full
    "gemma3_text": dict(COMMON, model_type="gemma3_text", num_hidden_layers=7, num_key_value_heads=2, head_dim=16,
                        sliding_window=3, query_pre_attn_scalar=24),
    "cohere2": dict(COMMON, model_type="cohere2", num_hidden_layers=5, num_key_value_heads=2, sliding_window=3,
                    logit_scale=0.125),
    # RoPE context extension, with original contexts short enough that the 7-token test spans the ramps
    "llama-linear": dict(COMMON, model_type="llama", rope_parameters=dict(rope_type="linear", factor=2.0,
                                                                          rope_theta=10000.0)),
    "llama-llama3": dict(COMMON, model_type="llama", num_key_value_heads=2, rope_parameters=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16, rope_theta=500000.0)),
    "qwen2-yarn": dict(COMMON, model_type="qwen2", num_key_value_heads=4, rope_parameters=dict(rope_type="yarn", factor=4.0,
                                                                        original_max_position_embeddings=16,
                                                                        rope_theta=10000.0)),
    # the 7-token test passes max_position_embeddings (dynamic) and the original context (longrope)
    "llama-dynamic": dict(COMMON, model_type="llama", num_key_value_heads=2, max_position_embeddings=4,
                          rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=10000.0)),
    "phi3-longrope": dict(COMMON, model_type="phi3", num_key_value_heads=2, partial_rotary_factor=0.5, pad_token_id=0,
                          original_max_position_embeddings=4, rope_parameters=dict(
                              rope_type="longrope", short_factor=[1.0, 1.25, 1.5, 2.0],
                              long_factor=[1.5, 3.0, 6.0, 12.0], rope_theta=10000.0)),
    # every third layer without RoPE and sliding (no_rope_layers derived from the interval, layer_types from them)
    "smollm3-nope": dict(COMMON, model_type="smollm3", num_hidden_layers=4, num_key_value_heads=2, pad_token_id=2,
                         no_rope_layer_interval=3, use_sliding_window=True, sliding_window=3),
    # mixtures of experts, 4 experts of which each token takes 2, compared with HF's reference loop over experts
    "mixtral": dict(MOE, model_type="mixtral", num_local_experts=4, sliding_window=4),
    "qwen2_moe": dict(MOE, model_type="qwen2_moe", num_experts=4, moe_intermediate_size=24,
                      shared_expert_intermediate_size=40),
    # layers 0 and 2 slide (odd-numbered, below max_window_layers), layer 1 does not
    "qwen2_moe-window": dict(MOE, model_type="qwen2_moe", num_experts=4, moe_intermediate_size=24,
                             shared_expert_intermediate_size=40, num_hidden_layers=3, use_sliding_window=True,
                             sliding_window=3),
    "qwen3_moe": dict(MOE, model_type="qwen3_moe", num_local_experts=4, moe_intermediate_size=24, norm_topk_prob=True),
    "olmoe": dict(MOE, model_type="olmoe", num_experts=4, attention_bias=True),
    "granitemoe": dict(MOE, model_type="granitemoe", num_local_experts=4, embedding_multiplier=12.0,
                       residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=8.0),
}

FALCON = dict(model_type="falcon", vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64)
MORE_CONFIGS: dict[str, dict] = {
    "bert": dict(COMMON, model_type="bert"),
    "roberta": dict(COMMON, model_type="roberta", hidden_act="gelu_new"),
    "xlm-roberta": dict(COMMON, model_type="xlm-roberta", type_vocab_size=1),
    "camembert": dict(COMMON, model_type="camembert"),
    "electra": dict(COMMON, model_type="electra", embedding_size=32),
    "distilbert": dict(model_type="distilbert", vocab_size=97, dim=64, hidden_dim=96, n_layers=2, n_heads=4,
                       max_position_embeddings=64),
    "opt": dict(model_type="opt", vocab_size=97, hidden_size=64, ffn_dim=96, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=64),
    "opt-post-ln": dict(model_type="opt", vocab_size=97, hidden_size=64, ffn_dim=96, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=64, do_layer_norm_before=False,
                        word_embed_proj_dim=32),
    "bloom": dict(model_type="bloom", vocab_size=97, hidden_size=48, n_layer=2, n_head=6),
    "gpt_bigcode": dict(model_type="gpt_bigcode", vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=32),
    "gpt_bigcode-mha": dict(model_type="gpt_bigcode", vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                            multi_query=False),
    "biogpt": dict(COMMON, model_type="biogpt", activation_dropout=0.1, pad_token_id=3),
    "gpt_neo": dict(model_type="gpt_neo", vocab_size=97, hidden_size=64, num_layers=2, num_heads=4,
                    max_position_embeddings=64, attention_types=[[["global", "local"], 1]], window_size=3),
    "falcon": dict(FALCON),
    "falcon-sequential": dict(FALCON, multi_query=False, parallel_attn=False, bias=True),
    "falcon-new": dict(FALCON, new_decoder_architecture=True, num_kv_heads=4),
    "falcon-new-mqa": dict(FALCON, new_decoder_architecture=True, num_kv_heads=1),
}
