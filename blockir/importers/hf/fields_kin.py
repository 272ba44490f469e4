"""The config fields of the near-copies of LLaMA, Gemma 2, OLMo 2 and GPT-NeoX written by the same writers with
other options (GLM, GLM-4, ERNIE 4.5, Jais 2, Nemotron, HyperCLOVA X, VaultGemma, OLMo 3, EXAONE 4, CWM, Persimmon, and
InternLM3, IQuest-Coder and EXAONE 3, whose configs HF builds ``LlamaForCausalLM`` from), as their transformers
config classes declare them.

Generated from the installed config classes and reviewed by hand; tests/test_import_schema.py checks every
default against the class and every field the modeling code reads against this table. The format is
described in blockir.importers.hf.family.
"""
from __future__ import annotations

from blockir.importers.hf.family import Family

_ROPE = dict(rope_scaling=('rope?', None, 'rope'))


def _glm(config: str) -> Family:
    return Family(config, {}, dict(
        vocab_size=('size', 151552), hidden_size=('size', 4096), intermediate_size=('size', 13696),
        num_hidden_layers=('layers', 40), num_attention_heads=('heads', 32),
        num_key_value_heads=('heads?', 2, '=num_attention_heads'),
        head_dim=('size?', 128, '=hidden_size // num_attention_heads'), hidden_act=('act', 'silu'),
        attention_dropout=('prob', 0.0), max_position_embeddings=('size', 131072),
        initializer_range=('real', 0.02, 'init'), rms_norm_eps=('eps', 1.5625e-07), use_cache=('bool', True),
        tie_word_embeddings=('bool', False), rope_parameters=('rope?', None),
        pad_token_id=('token?', 151329, 'row'), eos_token_id=('tokens?', [151329, 151336, 151338], 'gen'),
        bos_token_id=('token?', None, 'gen'), attention_bias=('bool', True),
        rope_theta=('positive', 10000.0, 'rope'), partial_rotary_factor=('fraction?', 0.5, 'rope'), **_ROPE))


def _llama_config(config: str, aliases: dict[str, str], **defaults: object) -> Family:
    """A config class of LLaMA's fields, without ``pretraining_tp``, that HF builds ``LlamaForCausalLM`` from; its
    own ``defaults`` replace LLaMA's."""
    fields = dict(
        vocab_size=('size', 32000), hidden_size=('size', 4096), intermediate_size=('size', 11008),
        num_hidden_layers=('layers', 32), num_attention_heads=('heads', 32),
        num_key_value_heads=('heads?', None, '=num_attention_heads'), hidden_act=('act', 'silu'),
        max_position_embeddings=('size', 2048), initializer_range=('real', 0.02, 'init'),
        rms_norm_eps=('eps', 1e-05), use_cache=('bool', True), pad_token_id=('token?', None, 'row'),
        bos_token_id=('token?', 1, 'gen'), eos_token_id=('tokens?', 2, 'gen'), tie_word_embeddings=('bool', False),
        rope_parameters=('rope?', None), attention_bias=('bool', False), attention_dropout=('prob', 0.0),
        mlp_bias=('bool', False), head_dim=('size?', None, '=hidden_size // num_attention_heads'),
        rope_theta=('positive', 10000.0, 'rope'), **_ROPE)
    for name, value in defaults.items():
        kind, _, *note = fields[name]
        fields[name] = (kind, value, *note)
    return Family(config, aliases, fields)


FAMILIES: dict[str, Family] = {
    "internlm3": _llama_config("InternLM3Config", {"qkv_bias": "attention_bias", "bias": "mlp_bias"},
                               vocab_size=128512, intermediate_size=10240, num_hidden_layers=48,
                               num_key_value_heads=2, max_position_embeddings=32768, pad_token_id=2, head_dim=128),
    "iquestcoder": _llama_config("IQuestCoderConfig", {}, vocab_size=76800, hidden_size=5120,
                                 intermediate_size=27648, num_hidden_layers=80, num_attention_heads=40,
                                 num_key_value_heads=8, max_position_embeddings=131072, head_dim=128),
    "exaone": _llama_config("ExaoneConfig", {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
                                             "activation_function": "hidden_act"},
                            vocab_size=102400, intermediate_size=14336, num_key_value_heads=8,
                            max_position_embeddings=4096, pad_token_id=0, eos_token_id=361, rope_theta=500000.0),
    "glm": _glm("GlmConfig"),
    "glm4": _glm("Glm4Config"),
    "ernie4_5": Family("Ernie4_5Config", {}, dict(
        vocab_size=('size', 103424), hidden_size=('size', 1024), intermediate_size=('size', 3072),
        num_hidden_layers=('layers', 18), num_attention_heads=('heads', 16),
        num_key_value_heads=('heads?', 2, '=num_attention_heads'), hidden_act=('act', 'silu'),
        max_position_embeddings=('size', 131072), initializer_range=('real', 0.02, 'init'),
        rms_norm_eps=('eps', 1e-05), use_cache=('bool', True), pad_token_id=('token?', 0, 'row'),
        bos_token_id=('token?', 1, 'gen'), eos_token_id=('tokens?', 2, 'gen'), tie_word_embeddings=('bool', True),
        rope_parameters=('rope?', None), use_bias=('bool', False),
        head_dim=('size?', 128, '=hidden_size // num_attention_heads'),
        rope_theta=('positive', 500000.0, 'rope'), **_ROPE)),
    "jais2": Family("Jais2Config", {}, dict(
        vocab_size=('size', 150272), hidden_size=('size', 3328), intermediate_size=('size', 26624),
        num_hidden_layers=('layers', 32), num_attention_heads=('heads', 26),
        num_key_value_heads=('heads?', None, '=num_attention_heads'), hidden_act=('act', 'relu2'),
        max_position_embeddings=('size', 8192), initializer_range=('real', 0.02, 'init'), use_cache=('bool', True),
        pad_token_id=('token?', None, 'row'), bos_token_id=('token?', 0, 'gen'),
        eos_token_id=('tokens?', 150024, 'gen'), tie_word_embeddings=('bool', False),
        rope_parameters=('rope?', None), attention_bias=('bool', True), attention_dropout=('prob', 0.0),
        mlp_bias=('bool', True), head_dim=('size?', None, '=hidden_size // num_attention_heads'),
        layer_norm_eps=('eps', 1e-05),
        rope_theta=('positive', 10000.0, 'rope'), **_ROPE)),
    "nemotron": Family("NemotronConfig", {}, dict(
        vocab_size=('size', 256000), hidden_size=('size', 6144), intermediate_size=('size', 24576),
        num_hidden_layers=('layers', 32), num_attention_heads=('heads', 48),
        head_dim=('size?', None, '=hidden_size // num_attention_heads'),
        num_key_value_heads=('heads?', None), hidden_act=('act', 'relu2'),  # no default: HF's model needs them
        max_position_embeddings=('size', 4096), initializer_range=('real', 0.0134, 'init'), norm_eps=('eps', 1e-05),
        use_cache=('bool', True), pad_token_id=('token?', None, 'row'), bos_token_id=('token?', 2, 'gen'),
        eos_token_id=('tokens?', 3, 'gen'), tie_word_embeddings=('bool', False), rope_parameters=('rope?', None),
        attention_bias=('bool', False), attention_dropout=('prob', 0.0), mlp_bias=('bool', False),
        rope_theta=('positive', 10000.0, 'rope'), partial_rotary_factor=('fraction?', 0.5, 'rope'), **_ROPE)),
    "hyperclovax": Family("HyperCLOVAXConfig", {}, dict(
        vocab_size=('size', 32000), hidden_size=('size', 4096), intermediate_size=('size', 11008),
        num_hidden_layers=('layers', 32), num_attention_heads=('heads', 32),
        num_key_value_heads=('heads?', None, '=num_attention_heads'), hidden_act=('act', 'silu'),
        max_position_embeddings=('size', 2048), initializer_range=('real', 0.02, 'init'), rms_norm_eps=('eps', 1e-06),
        use_cache=('bool', True), pad_token_id=('token?', None, 'row'), bos_token_id=('token?', 1, 'gen'),
        eos_token_id=('tokens?', 2, 'gen'), tie_word_embeddings=('bool', False), rope_parameters=('rope?', None),
        attention_bias=('bool', False), attention_dropout=('prob', 0.0), mlp_bias=('bool', False),
        embedding_multiplier=('real', 1.0), logits_scaling=('real', 1.0), residual_multiplier=('real', 1.0),
        head_dim=('size?', None, '=hidden_size // num_attention_heads'),
        attention_multiplier=('real?', None, '=head_dim ** -0.5'), use_post_norm=('bool', True),
        rope_theta=('positive', 10000.0, 'rope'), **_ROPE)),
    "vaultgemma": Family("VaultGemmaConfig", {}, dict(
        vocab_size=('size', 256000), hidden_size=('size', 2304), intermediate_size=('size', 9216),
        num_hidden_layers=('layers', 26), num_attention_heads=('heads', 8),
        num_key_value_heads=('heads?', 4, '=num_attention_heads'),
        head_dim=('size?', 256, '=hidden_size // num_attention_heads'), hidden_activation=('act', 'gelu_pytorch_tanh'),
        max_position_embeddings=('size', 8192), initializer_range=('real', 0.02, 'init'),
        rms_norm_eps=('eps', 1e-06), use_cache=('bool', True), pad_token_id=('token?', 0, 'row'),
        eos_token_id=('tokens?', 1, 'gen'), bos_token_id=('token?', 2, 'gen'), tie_word_embeddings=('bool', True),
        rope_parameters=('rope?', None), attention_bias=('bool', False), attention_dropout=('prob', 0.0),
        query_pre_attn_scalar=('positive', 256), sliding_window=('window?', 4096),
        layer_types=('layer_types?', None, '=period 2'), final_logit_softcapping=('positive?', 30.0),
        attn_logit_softcapping=('positive?', 50.0),
        rope_theta=('positive', 10000.0, 'rope'), **_ROPE)),
    "olmo3": Family("Olmo3Config", {}, dict(
        head_dim=('size?', None, '=hidden_size // num_attention_heads'),
        vocab_size=('size', 50304), hidden_size=('size', 4096), intermediate_size=('size', 11008),
        num_hidden_layers=('layers', 32), num_attention_heads=('heads', 32),
        num_key_value_heads=('heads?', None, '=num_attention_heads'), hidden_act=('act', 'silu'),
        max_position_embeddings=('size', 2048), initializer_range=('real', 0.02, 'init'), use_cache=('bool', True),
        pad_token_id=('token?', 1, 'row'), bos_token_id=('token?', None, 'gen'),
        eos_token_id=('tokens?', 50279, 'gen'), tie_word_embeddings=('bool', False),
        rope_parameters=('ropes?', {"sliding_attention": {"rope_type": "default"},
                                    "full_attention": {"rope_type": "default"}}),
        attention_bias=('bool', False), attention_dropout=('prob', 0.0), rms_norm_eps=('eps', 1e-05),
        sliding_window=('window?', 4096), layer_types=('layer_types?', None, '=period 4'),
        rope_theta=('positive', 500000.0, 'rope'), **_ROPE)),
    "exaone4": Family("Exaone4Config", {}, dict(
        head_dim=('size?', None, '=hidden_size // num_attention_heads'),
        vocab_size=('size', 102400), hidden_size=('size', 4096), intermediate_size=('size', 16384),
        num_hidden_layers=('layers', 32), num_attention_heads=('heads', 32),
        num_key_value_heads=('heads?', 32, '=num_attention_heads'), hidden_act=('act', 'silu'),
        max_position_embeddings=('size', 2048), initializer_range=('real', 0.02, 'init'),
        rms_norm_eps=('eps', 1e-05), use_cache=('bool', True), bos_token_id=('token?', 0, 'gen'),
        eos_token_id=('tokens?', 2, 'gen'), pad_token_id=('token?', None, 'row'),
        tie_word_embeddings=('bool', False), rope_parameters=('rope?', None), attention_dropout=('prob', 0.0),
        sliding_window=('window?', 4096), sliding_window_pattern=('size', 4),
        layer_types=('layer_types?', None, '=period sliding_window_pattern'),
        rope_theta=('positive', 10000.0, 'rope'), **_ROPE)),
    "persimmon": Family("PersimmonConfig", {}, dict(
        head_dim=('size?', None, '=hidden_size // num_attention_heads'),
        vocab_size=('size', 262144), hidden_size=('size', 4096), intermediate_size=('size', 16384),
        num_hidden_layers=('layers', 36), num_attention_heads=('heads', 64), hidden_act=('act', 'relu2'),
        max_position_embeddings=('size', 16384), initializer_range=('real', 0.02, 'init'),
        layer_norm_eps=('eps', 1e-05), use_cache=('bool', True), tie_word_embeddings=('bool', False),
        rope_parameters=('rope?', None), qk_layernorm=('bool', True), hidden_dropout=('prob', 0.0),
        attention_dropout=('prob', 0.0), pad_token_id=('token?', None, 'row'), bos_token_id=('token?', 1, 'gen'),
        eos_token_id=('tokens?', 2, 'gen'),
        rope_theta=('positive', 10000.0, 'rope'), partial_rotary_factor=('fraction?', 0.5, 'rope'), **_ROPE),
        frozenset({"qk_layernorm"})),
    "cwm": Family("CwmConfig", {}, dict(
        vocab_size=('size', 128256), hidden_size=('size', 6144), intermediate_size=('size', 21504),
        num_hidden_layers=('layers', 64), num_attention_heads=('heads', 48),
        num_key_value_heads=('heads?', 8, '=num_attention_heads'), hidden_act=('act', 'silu'),
        max_position_embeddings=('size', 131072), initializer_range=('real', 0.02, 'init'),
        rms_norm_eps=('eps', 1e-05), use_cache=('bool', True), pad_token_id=('token?', None, 'row'),
        bos_token_id=('token?', 128000, 'gen'), eos_token_id=('tokens?', [128001, 128008, 128009], 'gen'),
        pretraining_tp=('size', 1, 'tp'), tie_word_embeddings=('bool', False),
        rope_parameters=('rope?', {"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 16.0,
                                   "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                   "original_max_position_embeddings": 8192}),
        attention_dropout=('prob', 0.0), mlp_bias=('bool', False),
        head_dim=('size?', 128, '=hidden_size // num_attention_heads'), sliding_window=('window?', 8192),
        layer_types=('layer_types?', None, '=first of period 4'),
        rope_theta=('positive', 1000000.0, 'rope'), **_ROPE)),
}
