"""The config fields of the mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GraniteMoE), as
their transformers config classes declare them.

Generated from the installed config classes and reviewed by hand; tests/test_import_schema.py checks every
default against the class and every field the modeling code reads against this table. The format is
described in blockir.importers.hf.family.
"""
from __future__ import annotations

from blockir.importers.hf.family import Family

_ROPE = dict(rope_parameters=('rope?', None), rope_scaling=('rope?', None, 'rope'),
             partial_rotary_factor=('fraction?', None, 'rope'))
_ROUTER = dict(output_router_logits=('bool', False, 'aux'), router_aux_loss_coef=('real', 0.001, 'aux'))

FAMILIES: dict[str, Family] = {
    "granitemoe": Family("GraniteMoeConfig", {}, dict(
        head_dim=('size?', None, '=hidden_size // num_attention_heads'),
        vocab_size=('size', 32000), hidden_size=('size', 4096), intermediate_size=('size', 11008),
        num_hidden_layers=('layers', 32), num_attention_heads=('heads', 32),
        num_key_value_heads=('heads?', None, '=num_attention_heads'), hidden_act=('act', 'silu'),
        max_position_embeddings=('size', 2048), initializer_range=('real', 0.02, 'init'),
        rms_norm_eps=('eps', 1e-06), use_cache=('bool', True), pad_token_id=('token?', None, 'row'),
        bos_token_id=('token?', 1, 'gen'), eos_token_id=('tokens?', 2, 'gen'), tie_word_embeddings=('bool', False),
        attention_bias=('bool', False), attention_dropout=('prob', 0.0),
        embedding_multiplier=('real', 1.0), logits_scaling=('real', 1.0), residual_multiplier=('real', 1.0),
        attention_multiplier=('real', 1.0), num_local_experts=('size', 8), num_experts_per_tok=('size', 2),
        **_ROUTER, rope_theta=('positive', 10000.0, 'rope'), **_ROPE)),
    "mixtral": Family("MixtralConfig", {"num_experts": "num_local_experts"}, dict(
        vocab_size=('size', 32000), hidden_size=('size', 4096), intermediate_size=('size', 14336),
        num_hidden_layers=('layers', 32), num_attention_heads=('heads', 32),
        num_key_value_heads=('heads?', 8, '=num_attention_heads'),
        head_dim=('size?', None), hidden_act=('act', 'silu'), max_position_embeddings=('size', 131072),
        initializer_range=('real', 0.02, 'init'),
        rms_norm_eps=('eps', 1e-05), use_cache=('bool', True), pad_token_id=('token?', None, 'row'),
        bos_token_id=('token?', 1, 'gen'), eos_token_id=('tokens?', 2, 'gen'), tie_word_embeddings=('bool', False),
        sliding_window=('window?', None), attention_dropout=('prob', 0.0), num_experts_per_tok=('size', 2),
        num_local_experts=('size', 8), router_jitter_noise=('prob', 0.0), **_ROUTER,
        rope_theta=('positive', 1000000.0, 'rope'), **_ROPE)),
    "olmoe": Family("OlmoeConfig", {"num_local_experts": "num_experts"}, dict(
        vocab_size=('size', 50304), hidden_size=('size', 2048), intermediate_size=('size', 2048),
        num_hidden_layers=('layers', 16), num_attention_heads=('heads', 16),
        num_key_value_heads=('heads?', None, '=num_attention_heads'),
        head_dim=('size?', None, '=hidden_size // num_attention_heads'), hidden_act=('act', 'silu'),
        max_position_embeddings=('size', 4096), initializer_range=('real', 0.02, 'init'),
        rms_norm_eps=('eps', 1e-05), use_cache=('bool', True), pad_token_id=('token?', 1, 'row'),
        bos_token_id=('token?', None, 'gen'), eos_token_id=('tokens?', 50279, 'gen'),
        tie_word_embeddings=('bool', False), attention_bias=('bool', False), attention_dropout=('prob', 0.0),
        clip_qkv=('real?', None), sliding_window=('window?', None, 'flash'), num_experts_per_tok=('size', 8),
        num_experts=('size', 64), norm_topk_prob=('bool', False),
        output_router_logits=('bool', False, 'aux'), router_aux_loss_coef=('real', 0.01, 'aux'),
        rope_theta=('positive', 10000.0, 'rope'), **_ROPE)),
    "qwen2_moe": Family("Qwen2MoeConfig", {}, dict(
        vocab_size=('size', 151936), hidden_size=('size', 2048), intermediate_size=('size', 5632, 'dense'),
        num_hidden_layers=('layers', 24), num_attention_heads=('heads', 16),
        num_key_value_heads=('heads?', 16, '=num_attention_heads'),
        head_dim=('size?', None, '=hidden_size // num_attention_heads'), hidden_act=('act', 'silu'),
        max_position_embeddings=('size', 32768), initializer_range=('real', 0.02, 'init'),
        rms_norm_eps=('eps', 1e-06), use_cache=('bool', True), tie_word_embeddings=('bool', False),
        use_sliding_window=('bool', False), sliding_window=('count?', 4096, '=if use_sliding_window else 0'),
        max_window_layers=('layers', 28), layer_types=('layer_types?', None, '=odd max_window_layers'),
        attention_dropout=('prob', 0.0), decoder_sparse_step=('size', 1), moe_intermediate_size=('size', 1408),
        shared_expert_intermediate_size=('size', 5632), num_experts_per_tok=('size', 4), num_experts=('size', 60),
        norm_topk_prob=('bool', False), mlp_only_layers=('layer_list?', []), qkv_bias=('bool', True),
        pad_token_id=('token?', None, 'row'), bos_token_id=('token?', None, 'gen'),
        eos_token_id=('tokens?', None, 'gen'), **_ROUTER,
        rope_theta=('positive', 10000.0, 'rope'), **_ROPE)),
    "qwen3_moe": Family("Qwen3MoeConfig", {"num_experts": "num_local_experts"}, dict(
        vocab_size=('size', 151936), hidden_size=('size', 2048), intermediate_size=('size', 6144, 'dense'),
        num_hidden_layers=('layers', 24), num_attention_heads=('heads', 32),
        num_key_value_heads=('heads?', 4, '=num_attention_heads'),
        head_dim=('size?', None, '=hidden_size // num_attention_heads'), hidden_act=('act', 'silu'),
        max_position_embeddings=('size', 32768), initializer_range=('real', 0.02, 'init'),
        rms_norm_eps=('eps', 1e-06), use_cache=('bool', True), tie_word_embeddings=('bool', False),
        attention_bias=('bool', False), use_sliding_window=('bool', False),
        sliding_window=('window?', 4096, '=if use_sliding_window'), attention_dropout=('prob', 0.0),
        decoder_sparse_step=('size', 1), moe_intermediate_size=('size', 768), num_experts_per_tok=('size', 8),
        num_experts=('size', 128, 'stored'), num_local_experts=('size', 128), norm_topk_prob=('bool', False),
        mlp_only_layers=('layer_list?', []),
        pad_token_id=('token?', None, 'row'), bos_token_id=('token?', None, 'gen'),
        eos_token_id=('tokens?', None, 'gen'), **_ROUTER,
        rope_theta=('positive', 10000.0, 'rope'), **_ROPE)),
}
