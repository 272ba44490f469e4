"""The config fields of the BERT-style encoders, as their transformers config classes declare them.

Generated from the installed config classes and reviewed by hand; tests/test_import_schema.py checks every
default against the class and every field the modeling code reads against this table. The format is
described in blockir.importers.hf.family.
"""
from __future__ import annotations

from blockir.importers.hf.family import Family

FAMILIES: dict[str, Family] = {
    "bert": Family("BertConfig", {}, dict(
        vocab_size=('size', 30522), hidden_size=('size', 768), num_hidden_layers=('layers', 12),
        num_attention_heads=('heads', 12), intermediate_size=('size', 3072), hidden_act=('act', 'gelu'),
        hidden_dropout_prob=('prob', 0.1), attention_probs_dropout_prob=('prob', 0.1),
        max_position_embeddings=('size', 512), type_vocab_size=('size', 2), initializer_range=('real', 0.02, 'init'),
        layer_norm_eps=('eps', 1e-12), pad_token_id=('token?', 0, 'row'), use_cache=('bool', True),
        classifier_dropout=('prob?', None, 'cls'), is_decoder=('bool', False),
        add_cross_attention=('bool', False), bos_token_id=('token?', None, 'gen'),
        eos_token_id=('tokens?', None, 'gen'), tie_word_embeddings=('bool', True))),
    "camembert": Family("CamembertConfig", {}, dict(
        vocab_size=('size', 30522), hidden_size=('size', 768), num_hidden_layers=('layers', 12),
        num_attention_heads=('heads', 12), intermediate_size=('size', 3072), hidden_act=('act', 'gelu'),
        hidden_dropout_prob=('prob', 0.1), attention_probs_dropout_prob=('prob', 0.1),
        max_position_embeddings=('size', 512), type_vocab_size=('size', 2), initializer_range=('real', 0.02, 'init'),
        layer_norm_eps=('eps', 1e-12), pad_token_id=('token?', 1, 'row'), bos_token_id=('token?', 0, 'gen'),
        eos_token_id=('tokens?', 2, 'gen'), use_cache=('bool', True), classifier_dropout=('prob?', None, 'cls'),
        is_decoder=('bool', False), add_cross_attention=('bool', False),
        tie_word_embeddings=('bool', True))),
    "distilbert": Family("DistilBertConfig", {
        'hidden_size': 'dim', 'num_attention_heads': 'n_heads', 'num_hidden_layers': 'n_layers',
    }, dict(
        vocab_size=('size', 30522), max_position_embeddings=('size', 512), sinusoidal_pos_embds=('bool', False),
        n_layers=('layers', 6), n_heads=('heads', 12), dim=('size', 768), hidden_dim=('size', 3072),
        dropout=('prob', 0.1), attention_dropout=('prob', 0.1), activation=('act', 'gelu'),
        initializer_range=('real', 0.02, 'init'), qa_dropout=('prob', 0.1, 'cls'),
        seq_classif_dropout=('prob', 0.2, 'cls'), pad_token_id=('token?', 0, 'row'),
        eos_token_id=('tokens?', None, 'gen'),
        bos_token_id=('token?', None, 'gen'), tie_word_embeddings=('bool', True))),
    "electra": Family("ElectraConfig", {}, dict(
        vocab_size=('size', 30522), embedding_size=('size', 128), hidden_size=('size', 256),
        num_hidden_layers=('layers', 12), num_attention_heads=('heads', 4), intermediate_size=('size', 1024),
        hidden_act=('act', 'gelu'), hidden_dropout_prob=('prob', 0.1), attention_probs_dropout_prob=('prob', 0.1),
        max_position_embeddings=('size', 512), type_vocab_size=('size', 2), initializer_range=('real', 0.02, 'init'),
        layer_norm_eps=('eps', 1e-12), summary_type=('str', 'first', 'summary'),
        summary_use_proj=('bool', True, 'summary'), summary_activation=('str', 'gelu', 'summary'),
        summary_last_dropout=('prob', 0.1, 'summary'), pad_token_id=('token?', 0, 'row'), use_cache=('bool', True),
        classifier_dropout=('prob?', None, 'cls'), is_decoder=('bool', False),
        add_cross_attention=('bool', False), bos_token_id=('token?', None, 'gen'),
        eos_token_id=('tokens?', None, 'gen'), tie_word_embeddings=('bool', True))),
    "roberta": Family("RobertaConfig", {}, dict(
        vocab_size=('size', 50265), hidden_size=('size', 768), num_hidden_layers=('layers', 12),
        num_attention_heads=('heads', 12), intermediate_size=('size', 3072), hidden_act=('act', 'gelu'),
        hidden_dropout_prob=('prob', 0.1), attention_probs_dropout_prob=('prob', 0.1),
        max_position_embeddings=('size', 512), type_vocab_size=('size', 2), initializer_range=('real', 0.02, 'init'),
        layer_norm_eps=('eps', 1e-12), pad_token_id=('token?', 1, 'row'), bos_token_id=('token?', 0, 'gen'),
        eos_token_id=('tokens?', 2, 'gen'), use_cache=('bool', True), classifier_dropout=('prob?', None, 'cls'),
        is_decoder=('bool', False), add_cross_attention=('bool', False),
        tie_word_embeddings=('bool', True))),
    "xlm-roberta": Family("XLMRobertaConfig", {}, dict(
        vocab_size=('size', 30522), hidden_size=('size', 768), num_hidden_layers=('layers', 12),
        num_attention_heads=('heads', 12), intermediate_size=('size', 3072), hidden_act=('act', 'gelu'),
        hidden_dropout_prob=('prob', 0.1), attention_probs_dropout_prob=('prob', 0.1),
        max_position_embeddings=('size', 512), type_vocab_size=('size', 2), initializer_range=('real', 0.02, 'init'),
        layer_norm_eps=('eps', 1e-12), pad_token_id=('token?', 1, 'row'), bos_token_id=('token?', 0, 'gen'),
        eos_token_id=('tokens?', 2, 'gen'), use_cache=('bool', True), classifier_dropout=('prob?', None, 'cls'),
        is_decoder=('bool', False), add_cross_attention=('bool', False),
        tie_word_embeddings=('bool', True))),
}
