"""The shape of the per-family config tables, and the facts every family shares.

A family's table lists exactly the fields its transformers config class and modeling code read, each as
``(kind, default)`` or ``(kind, default, note)``. The kind names a type and a valid range
(``blockir.importers.hf.schema.KINDS``); the default is the config class's own. A note is one of:

- ``"=…"``: the default is derived from other fields when the field is absent or null, as the config
  class's ``__post_init__`` does (``"=num_attention_heads"``, ``"=hidden_size // num_attention_heads"``,
  ``"=period 6"`` …, read by ``hf_schema.derive``);
- ``"rope"``: a legacy key the config class folds into ``rope_parameters`` (``rope_theta``,
  ``partial_rotary_factor``, ``rope_scaling`` …);
- a key of :data:`IGNORED`: the field is validated but deliberately not written, for the reason given.

``aliases`` is the config class's ``attribute_map``: a key HF accepts under another name.
"""
from __future__ import annotations

from typing import Any, NamedTuple


# HF activation name -> the language's
ACTS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_fast": "gelu_new", "relu": "relu", "tanh": "tanh", "relu2": "relu2", "quick_gelu": "quick_gelu",
        "gelu_accurate": "gelu_accurate", "mish": "mish"}


class Family(NamedTuple):
    config: str  # the transformers config class
    aliases: dict[str, str]  # HF's attribute_map: the other name → the field
    fields: dict[str, tuple[Any, ...]]
    states: frozenset[str] = frozenset()  # fields of REFUSED this family's writer states with any value


IGNORED = {
    "init": "initialisation only: the file states no initialiser, weights come from the checkpoint",
    "gen": "read by generation, not by the forward",
    "cls": "read only by the classification, token-classification and question-answering heads",
    "summary": "read only by the sequence-summary heads (double heads, multiple choice)",
    "tp": "HF's old tensor-parallel slicing of the projections: the same product",
    "pad": "not given to the token table by this family's code; read by generation and the loss only",
    "unread": "kept by the config class, read by no modeling code",
    "f32": "the softmax is taken in f32 either way",
    "exact": "only changes the order of additions when pretraining_tp > 1",
    "chunk": "splits the feed-forward over the sequence: the same result",
    "mm": "read only by the multimodal classes of the same modeling file",
    "replaced": "derived by the config class from other fields; a given value is replaced",
    "hf": "a setting of HF's own runtime (return types, attention kernel, logging), not of the model",
    "aux": "the router's load-balancing loss, added to the training loss only: the logits do not read it",
    "flash": "passed to the flash-attention kernels only: the causal mask of the eager and SDPA paths has no window",
    "stored": "the class's attribute_map stores it under another field, the one its config.json holds and the "
              "code reads",
    "dense": "read only by the dense MLP layers of mlp_only_layers and decoder_sparse_step, which are refused",
}

# fields a family has and the file cannot state unless they hold the value HF's default gives: value, message
REFUSED: dict[str, tuple[Any, str]] = {
    "is_decoder": (False, "is_decoder=true (the encoder as a causal decoder) is not supported"),
    "add_cross_attention": (False, "add_cross_attention=true (cross-attention layers) is not supported"),
    "layerdrop": (0, "layerdrop (skipping whole layers while training) is not supported"),
    "clip_qkv": (None, "clip_qkv (clamping q, k and v) is not supported"),
    "qk_layernorm": (False, "q/k LayerNorms of their own for each head (qk_layernorm) are not supported"),
    "use_qk_norm": (False, "Cohere's q/k norms (use_qk_norm) are not supported"),
    "sinusoidal_pos_embds": (False, "DistilBERT's frozen sinusoidal position table (sinusoidal_pos_embds) is not "
                                    "supported"),
    "apply_residual_connection_post_layernorm": (False, "BLOOM's apply_residual_connection_post_layernorm (the "
                                                        "residual taken after the norm) is not supported"),
    "scale_attn_by_inverse_layer_idx": (False, "GPT-2's scale_attn_by_inverse_layer_idx is not supported"),
    "reorder_and_upcast_attn": (False, "GPT-2's reorder_and_upcast_attn is not supported"),
    "use_bidirectional_attention": (False, "bidirectional attention (use_bidirectional_attention) is not supported"),
    "alibi": (False, "Falcon with alibi=true is not supported"),
    "router_jitter_noise": (0.0, "Mixtral's router_jitter_noise (scaling the hidden states by random noise while "
                                 "training) is not supported"),
}

# model types of the installed transformers whose layer uses a construct the language cannot state: what it is
UNWRITTEN: dict[str, str] = {
    "apertus": "its MLP's xIELU activation (learned per layer) has no counterpart in the language",
    "hunyuan_v1_dense": "its q/k RMSNorms (query_layernorm, key_layernorm) act after RoPE; the language's qk_norm "
                        "acts before",
    "nanochat": "its q/k norms act after RoPE, and its final norm also runs on the embeddings",
    "granite_swa": "its attention has learned per-head sinks",
    "ministral3": "its queries are scaled by position (llama_4_scaling_beta)",
    "youtu": "its attention is DeepSeek-V3's multi-head latent attention (low-rank q and kv projections)",
    "bitnet": "its branches norm inside themselves (attn_sub_norm before o_proj, ffn_sub_norm before down_proj)",
    "xglm": "its positions come from a fixed sinusoidal table",
    "diffllama": "its attention is differential (two softmax maps subtracted with a learned lambda)",
    "minicpm3": "its attention is DeepSeek-V2's multi-head latent attention (low-rank q and kv projections)",
    "lfm2": "most of its layers are short gated convolutions, not attention",
    "doge": "its attention adds a learned dynamic mask computed from the values (dt_proj, A)",
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba"), "its layers are selective state-space (Mamba) mixers, not "
                    "attention"),
    **dict.fromkeys(("jamba", "bamba", "zamba", "zamba2", "nemotron_h", "falcon_h1", "granitemoehybrid"),
                    "it mixes Mamba state-space layers with its attention layers"),
    "rwkv": "its layers are RWKV time-mixing recurrences, not attention",
    "recurrent_gemma": "most of its layers are RG-LRU recurrences, not attention",
    "xlstm": "its layers are xLSTM recurrences, not attention",
    "qwen3_next": "most of its layers are gated DeltaNet linear attention",
    **dict.fromkeys(("deepseek_v2", "deepseek_v3"), "its attention is multi-head latent attention (low-rank q and kv "
                    "projections)"),
    "phimoe": "its router is SparseMixer, which none of the moe branch's routings computes",
    "granitemoeshared": "its shared expert stores gate and up in one input_linear matrix, a layout the moe branch's "
                        "shared expert does not have",
    "gpt_oss": "its attention has learned per-head sinks",
    "mpt": "its config nests the attention's settings in attn_config, which the field tables cannot read yet",
    "ctrl": "its positions come from a fixed sinusoidal table",
    "reformer": "its attention is LSH-bucketed, not dense",
    "xlnet": "its attention is two-stream relative attention",
}

# read by PreTrainedConfig, PreTrainedModel or the runtime of every family
COMMON: dict[str, tuple[Any, ...]] = dict(
    model_type=("str", None), architectures=("strs?", None), dtype=("str?", None, "hf"),
    torch_dtype=("str?", None, "hf"), transformers_version=("str?", None, "hf"), _name_or_path=("str?", None, "hf"),
    _attn_implementation=("str?", None, "hf"), output_attentions=("bool?", None, "hf"),
    output_hidden_states=("bool?", None, "hf"), return_dict=("bool?", None, "hf"),
    use_return_dict=("bool?", None, "hf"),
    problem_type=("str?", None, "cls"), num_labels=("size?", None, "cls"), id2label=("any", None, "cls"),
    label2id=("any", None, "cls"), is_encoder_decoder=("bool?", None, "hf"),
    chunk_size_feed_forward=("any", None, "chunk"), classifier_dropout=("prob?", None, "cls"),
    hidden_dropout=("any", None, "cls"), summary_first_dropout=("any", None, "summary"),
    summary_last_dropout=("any", None, "summary"), summary_proj_to_labels=("any", None, "summary"),
)

# model_type -> its base model class (HF's ``AutoModel``) and the prefix its keys carry in the class the writer
# writes (the causal LM for decoders; encoders are written as the base model)
BASES: dict[str, tuple[str, str]] = {
    "arcee": ("ArceeModel", "model."), "bert": ("BertModel", ""), "biogpt": ("BioGptModel", "biogpt."),
    "bloom": ("BloomModel", "transformer."), "camembert": ("CamembertModel", ""),
    "codegen": ("CodeGenModel", "transformer."), "cohere": ("CohereModel", "model."),
    "cohere2": ("Cohere2Model", "model."), "distilbert": ("DistilBertModel", ""), "electra": ("ElectraModel", ""),
    "falcon": ("FalconModel", "transformer."), "gemma": ("GemmaModel", "model."),
    "gemma2": ("Gemma2Model", "model."), "glm": ("GlmModel", "model."), "glm4": ("Glm4Model", "model."),
    "ernie4_5": ("Ernie4_5Model", "model."), "jais2": ("Jais2Model", "model."),
    "vaultgemma": ("VaultGemmaModel", "model."), "olmo3": ("Olmo3Model", "model."), "cwm": ("CwmModel", "model."),
    "exaone4": ("Exaone4Model", "model."), "persimmon": ("PersimmonModel", "model."),
    "nemotron": ("NemotronModel", "model."), "hyperclovax": ("HyperCLOVAXModel", "model."),
    "internlm3": ("LlamaModel", "model."), "iquestcoder": ("LlamaModel", "model."), "exaone": ("LlamaModel", "model."),
    "gemma3_text": ("Gemma3TextModel", "model."),
    "gpt2": ("GPT2Model", "transformer."), "gpt_bigcode": ("GPTBigCodeModel", "transformer."),
    "gpt_neo": ("GPTNeoModel", "transformer."), "gpt_neox": ("GPTNeoXModel", "gpt_neox."),
    "gptj": ("GPTJModel", "transformer."), "granite": ("GraniteModel", "model."),
    "granitemoe": ("GraniteMoeModel", "model."),
    "helium": ("HeliumModel", "model."), "llama": ("LlamaModel", "model."),
    "ministral": ("MinistralModel", "model."), "mistral": ("MistralModel", "model."),
    "mixtral": ("MixtralModel", "model."), "olmo": ("OlmoModel", "model."), "olmo2": ("Olmo2Model", "model."),
    "olmoe": ("OlmoeModel", "model."), "opt": ("OPTModel", "model."),
    "phi": ("PhiModel", "model."), "phi3": ("Phi3Model", "model."), "qwen2": ("Qwen2Model", "model."),
    "qwen2_moe": ("Qwen2MoeModel", "model."), "qwen3_moe": ("Qwen3MoeModel", "model."),
    "qwen3": ("Qwen3Model", "model."), "roberta": ("RobertaModel", ""), "seed_oss": ("SeedOssModel", "model."),
    "smollm3": ("SmolLM3Model", "model."), "stablelm": ("StableLmModel", "model."),
    "starcoder2": ("Starcoder2Model", "model."), "xlm-roberta": ("XLMRobertaModel", ""),
}
