"""The config fields of the GPT-style decoders: learned or rotary positions, fused projections (GPT-2, GPT-J,
GPT-NeoX, Falcon, OPT …), as their transformers config classes declare them.

Generated from the installed config classes and reviewed by hand; tests/test_import_schema.py checks every
default against the class and every field the modeling code reads against this table. The format is
described in blockir.importers.hf.family.
"""
from __future__ import annotations

from blockir.importers.hf.family import Family

FAMILIES: dict[str, Family] = {
    "biogpt": Family("BioGptConfig", {}, dict(
        vocab_size=('size', 42384), hidden_size=('size', 1024), num_hidden_layers=('layers', 24),
        num_attention_heads=('heads', 16), intermediate_size=('size', 4096), hidden_act=('act', 'gelu'),
        hidden_dropout_prob=('prob', 0.1), attention_probs_dropout_prob=('prob', 0.1),
        max_position_embeddings=('size', 1024), initializer_range=('real', 0.02, 'init'),
        layer_norm_eps=('eps', 1e-12, 'unread'), scale_embedding=('bool', True), use_cache=('bool', True),
        layerdrop=('prob', 0.0), activation_dropout=('prob', 0.0), pad_token_id=('token?', 1, 'row'),
        bos_token_id=('token?', 0, 'gen'), eos_token_id=('tokens?', 2, 'gen'), tie_word_embeddings=('bool', True))),
    "bloom": Family("BloomConfig", {'num_hidden_layers': 'n_layer', 'num_attention_heads': 'n_head'}, dict(
        vocab_size=('size', 250880), hidden_size=('size', 64), n_layer=('layers', 2), n_head=('heads', 8),
        layer_norm_epsilon=('eps', 1e-05), initializer_range=('real', 0.02, 'init'), use_cache=('bool', True),
        bos_token_id=('token?', 1, 'gen'), eos_token_id=('tokens?', 2, 'gen'), pad_token_id=('token?', None, 'pad'),
        apply_residual_connection_post_layernorm=('bool', False), hidden_dropout=('prob', 0.0),
        attention_dropout=('prob', 0.0), pretraining_tp=('size', 1, 'tp'), slow_but_exact=('bool', False, 'exact'),
        tie_word_embeddings=('bool', True))),
    "codegen": Family("CodeGenConfig", {
        'max_position_embeddings': 'n_positions', 'hidden_size': 'n_embd', 'num_attention_heads': 'n_head',
        'num_hidden_layers': 'n_layer',
    }, dict(
        vocab_size=('size', 50400), n_positions=('size', 2048), n_ctx=('size', 2048, 'unread'),
        n_embd=('size', 4096), n_layer=('layers', 28), n_head=('heads', 16), rotary_dim=('size', 64),
        n_inner=('size?', None), activation_function=('act', 'gelu_new'), resid_pdrop=('prob', 0.0),
        embd_pdrop=('prob', 0.0), attn_pdrop=('prob', 0.0), layer_norm_epsilon=('eps', 1e-05),
        initializer_range=('real', 0.02, 'init'), use_cache=('bool', True), bos_token_id=('token?', 50256, 'gen'),
        eos_token_id=('tokens?', 50256, 'gen'), tie_word_embeddings=('bool', False))),
    "falcon": Family("FalconConfig", {}, dict(
        head_dim=('size?', None, '=hidden_size // num_attention_heads'),
        vocab_size=('size', 65024), hidden_size=('size', 4544), num_hidden_layers=('layers', 32),
        num_attention_heads=('heads', 71), num_ln_in_parallel_attn=('size?', None),
        layer_norm_epsilon=('eps', 1e-05), initializer_range=('real', 0.02, 'init'), use_cache=('bool', True),
        hidden_dropout=('prob', 0.0), attention_dropout=('prob', 0.0),
        num_kv_heads=('heads?', None, '=num_attention_heads'),
        alibi=('bool', False), new_decoder_architecture=('bool', False), multi_query=('bool', True),
        parallel_attn=('bool', True), bias=('bool', False), max_position_embeddings=('size', 2048),
        rope_parameters=('rope?', None),
        bos_token_id=('token?', 11, 'gen'), eos_token_id=('tokens?', 11, 'gen'), pad_token_id=('token?', None, 'pad'),
        ffn_hidden_size=('size?', None, '=hidden_size * 4'), activation=('act', 'gelu'),
        tie_word_embeddings=('bool', True),
        rope_theta=('positive', 10000.0, 'rope'), rope_scaling=('rope?', None, 'rope'),
        partial_rotary_factor=('fraction?', None, 'rope'))),
    "gpt2": Family("GPT2Config", {
        'hidden_size': 'n_embd', 'max_position_embeddings': 'n_positions', 'num_attention_heads': 'n_head',
        'num_hidden_layers': 'n_layer',
    }, dict(
        vocab_size=('size', 50257), n_positions=('size', 1024), n_embd=('size', 768), n_layer=('layers', 12),
        n_head=('heads', 12), n_inner=('size?', None), activation_function=('act', 'gelu_new'),
        resid_pdrop=('prob', 0.1), embd_pdrop=('prob', 0.1), attn_pdrop=('prob', 0.1),
        layer_norm_epsilon=('eps', 1e-05), initializer_range=('real', 0.02, 'init'),
        summary_type=('str', 'cls_index', 'summary'), summary_use_proj=('bool', True, 'summary'),
        summary_activation=('str?', None, 'summary'), summary_proj_to_labels=('bool', True, 'summary'),
        summary_first_dropout=('prob', 0.1, 'summary'), scale_attn_weights=('bool', True), use_cache=('bool', True),
        bos_token_id=('token?', 50256, 'gen'), eos_token_id=('tokens?', 50256, 'gen'),
        pad_token_id=('token?', None, 'pad'),
        scale_attn_by_inverse_layer_idx=('bool', False), reorder_and_upcast_attn=('bool', False),
        add_cross_attention=('bool', False), tie_word_embeddings=('bool', True))),
    "gpt_bigcode": Family("GPTBigCodeConfig", {
        'hidden_size': 'n_embd', 'max_position_embeddings': 'n_positions', 'num_attention_heads': 'n_head',
        'num_hidden_layers': 'n_layer',
    }, dict(
        vocab_size=('size', 50257), n_positions=('size', 1024), n_embd=('size', 768), n_layer=('layers', 12),
        n_head=('heads', 12), n_inner=('size?', None), activation_function=('act', 'gelu_pytorch_tanh'),
        resid_pdrop=('prob', 0.1), embd_pdrop=('prob', 0.1), attn_pdrop=('prob', 0.1),
        layer_norm_epsilon=('eps', 1e-05), initializer_range=('real', 0.02, 'init'),
        scale_attn_weights=('bool', True), use_cache=('bool', True), bos_token_id=('token?', 50256, 'gen'),
        eos_token_id=('tokens?', 50256, 'gen'), pad_token_id=('token?', None, 'pad'),
        attention_softmax_in_fp32=('bool', True, 'f32'), scale_attention_softmax_in_fp32=('bool', True, 'f32'),
        multi_query=('bool', True), add_cross_attention=('bool', False), tie_word_embeddings=('bool', True))),
    "gpt_neo": Family("GPTNeoConfig", {'num_attention_heads': 'num_heads', 'num_hidden_layers': 'num_layers'}, dict(
        attention_layers=('any', None, 'replaced'),
        vocab_size=('size', 50257), max_position_embeddings=('size', 2048), hidden_size=('size', 2048),
        num_layers=('layers', 24), attention_types=('attention_types?', [[['global', 'local'], 12]]),
        num_heads=('heads', 16), intermediate_size=('size?', None), window_size=('window?', 256),
        activation_function=('act', 'gelu_new'), resid_dropout=('prob', 0.0), embed_dropout=('prob', 0.0),
        attention_dropout=('prob', 0.0), classifier_dropout=('prob', 0.1, 'cls'), layer_norm_epsilon=('eps', 1e-05),
        initializer_range=('real', 0.02, 'init'), use_cache=('bool', True), bos_token_id=('token?', 50256, 'gen'),
        eos_token_id=('tokens?', 50256, 'gen'), pad_token_id=('token?', None, 'pad'),
        tie_word_embeddings=('bool', True))),
    "gpt_neox": Family("GPTNeoXConfig", {}, dict(
        head_dim=('size?', None, '=hidden_size // num_attention_heads'),
        vocab_size=('size', 50432), hidden_size=('size', 6144), num_hidden_layers=('layers', 44),
        num_attention_heads=('heads', 64), intermediate_size=('size', 24576), hidden_act=('act', 'gelu'),
        attention_dropout=('prob', 0.0), hidden_dropout=('prob', 0.0), classifier_dropout=('prob', 0.1, 'cls'),
        max_position_embeddings=('size', 2048), initializer_range=('real', 0.02, 'init'),
        layer_norm_eps=('eps', 1e-05), use_cache=('bool', True), bos_token_id=('token?', 0, 'gen'),
        eos_token_id=('tokens?', 2, 'gen'), pad_token_id=('token?', None, 'pad'), tie_word_embeddings=('bool', False),
        use_parallel_residual=('bool', True),
        rope_parameters=('rope?', None),
        attention_bias=('bool', True), is_decoder=('bool', False),
        rotary_emb_base=('positive', 10000.0, 'rope'), rotary_pct=('fraction', 0.25, 'rope'),
        rope_scaling=('rope?', None, 'rope'))),
    "gptj": Family("GPTJConfig", {
        'max_position_embeddings': 'n_positions', 'hidden_size': 'n_embd', 'num_attention_heads': 'n_head',
        'num_hidden_layers': 'n_layer',
    }, dict(
        vocab_size=('size', 50400), n_positions=('size', 2048), n_embd=('size', 4096), n_layer=('layers', 28),
        n_head=('heads', 16), rotary_dim=('size', 64), n_inner=('size?', None),
        activation_function=('act', 'gelu_new'), resid_pdrop=('prob', 0.0), embd_pdrop=('prob', 0.0),
        attn_pdrop=('prob', 0.0), layer_norm_epsilon=('eps', 1e-05), initializer_range=('real', 0.02, 'init'),
        use_cache=('bool', True), bos_token_id=('token?', 50256, 'gen'), eos_token_id=('tokens?', 50256, 'gen'),
        pad_token_id=('token?', None, 'pad'), tie_word_embeddings=('bool', False))),
    "opt": Family("OPTConfig", {}, dict(
        vocab_size=('size', 50272), hidden_size=('size', 768), num_hidden_layers=('layers', 12),
        ffn_dim=('size', 3072), max_position_embeddings=('size', 2048), do_layer_norm_before=('bool', True),
        _remove_final_layer_norm=('bool', False), word_embed_proj_dim=('size?', None, '=hidden_size'),
        dropout=('prob', 0.1), attention_dropout=('prob', 0.0), num_attention_heads=('heads', 12),
        activation_function=('act', 'relu'), layerdrop=('prob', 0.0), init_std=('real', 0.02, 'init'),
        use_cache=('bool', True), pad_token_id=('token?', 1, 'row'), bos_token_id=('token?', 2, 'gen'),
        eos_token_id=('tokens?', 2, 'gen'), enable_bias=('bool', True), layer_norm_elementwise_affine=('bool', True),
        tie_word_embeddings=('bool', True))),
}
