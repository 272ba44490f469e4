"""The declaration kinds a block may instantiate, with their argument schemas.

The norm kinds come from their families (``blockir.norms``). The builder checks every declaration against this table (unknown, missing and
ill-typed arguments), fills in defaults, and stores the arguments in table
order, so the printer shows the full contract of every declaration.
"""
from __future__ import annotations

from typing import Any

from blockir.ir.consts import LAYER, Bin, Name, Num
from blockir import norms
from blockir.ir.schema import ArgSpec, Implies, KindSpec
from blockir.norms import FAMILIES
from blockir.norms.args import name as _name
from blockir.norms.args import offset as _offset
from blockir.norms.rmsnorm import CASTS

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "tanh", "identity",
               # transformers' ACT2FN names without parameters, each computed exactly as there
               "gelu_new", "gelu_fast", "gelu_accurate", "gelu_python", "gelu_pytorch_tanh", "gelu_python_tanh",
               "gelu_10", "quick_gelu", "relu2", "relu6", "leaky_relu", "hardswish", "mish", "laplace",
               "sqrtsoftplus", "swish", "gelu_bloom")
# elementwise functions that make gates; usable in equations, not as a branch's activation
GATES = ("sigmoid", "erf")
MASKS = ("element", "row", "channel", "sample")


_GAIN = ArgSpec("init_gain", "expr", None,
                doc="Xavier init with this gain on value/output and MLP matrices (DeepNorm beta); q/k keep gain 1")
# per-role init of a built-in branch (roles: blockir/ir/init_roles.py), applied as init_std, init_gain, init_scale,
# init_zero
_INIT = (_GAIN,
         ArgSpec("init_std", "enum", None, choices=("fan_in",),
                 doc="fan_in: every matrix from N(0, 1/fan_in), an MLP's input matrices from N(0, 2/fan_in), biases "
                     "0 (DeepScaleLM)"),
         ArgSpec("init_scale", "expr", None,
                 doc="multiplies the initial weights of the layers before the last on the update path (v; fc1; "
                     "gate and up) (Fixup's L^(-1/(2m-2)))"),
         ArgSpec("init_zero", "bool", None,
                 doc="true: the last layer on the update path (o; fc2; down) starts at zero, weight and bias (Fixup)"))
# what a compiled module does not show: these change only how a branch starts, not what it computes
INIT_ONLY = tuple(a.name for a in _INIT)
# Fixup's scalar biases are parameters of their own, so a branch takes them beside its init-only arguments
_BRANCH_INIT = (*_INIT, ArgSpec("fixup_bias", "bool", None,
                                doc="true: Fixup's scalar biases between the branch's weight layers, learned and "
                                    "initialised to 0: fixup_bias_act before an MLP's activation, fixup_bias_out "
                                    "before the output layer (o; fc2; down)"))
_COUNTED = (Implies("score_residual", "mean", "score_count", Bin("+", Name(LAYER), Num(1)),
                    "a running mean over a stack's layers has held layer + 1 layers' scores after this one"),
            Implies("score_residual", "sum", "score_count", None, "only the running mean counts layers"))
_UNFUSED_V = tuple(Implies("fused", layout, "init_scale", None, "init_scale rescales the value projection alone; a "
                           f"fused={layout} layout stores it inside one q/k/v matrix") for layout in ("stacked", "heads"))
ROPE_STYLES = ("half", "interleaved")
ROPE_SCALINGS = ("linear", "llama3", "yarn", "dynamic", "longrope")
QKV_LAYOUTS = ("none", "stacked", "heads", "qvk_groups")
QK_NORMS = ("none", *norms.QK_NORMS)
ATTENTION_IMPLS = ("sdpa", "eager")
ROUTINGS = ("softmax_topk", "topk_softmax")


_ATTENTION_CORE = (
    ArgSpec("scale", "expr", None, doc="scores are multiplied by this; head_dim ** -0.5 if unset"),
    ArgSpec("softcap", "expr", None, doc="scores become softcap * tanh(scores / softcap) (Gemma 2)"),
    ArgSpec("dropout", "expr", Num(0.0), doc="dropout on the attention probabilities while training"),
    ArgSpec("impl", "enum", "sdpa", choices=ATTENTION_IMPLS,
            doc="sdpa: the fused kernel; eager: HF's eager reference op for op (bit-exact)"),
    ArgSpec("kv_cache", "bool", None, doc="eager: keys and values are laid out as a KV cache holds them "
            "(contiguous), as an HF decoder's eager attention reads them when it caches; unset: as projected"),
    ArgSpec("softmax_f32", "bool", True, doc="eager softmax in f32 then cast (LLaMA); false: in the input dtype"),
    ArgSpec("score_residual", "enum", None, choices=("sum", "mean"),
            doc="RealFormer (arXiv:2012.11747): add the previous layer's scores [B, H, T, S] to this layer's "
                "pre-softmax scores and return the running sum; called as y, s = attn(x, s_prev). mean: the "
                "running mean over the layers so far, ((l - 1) * s_prev + scores) / l with l = score_count"),
    ArgSpec("score_count", "expr", None,
            doc="score_residual=mean: the layers whose scores the returned mean holds; layer + 1 (the stack's "
                "layer index counts from 0)"),
    ArgSpec("scale_query", "bool", False, doc="scale the queries after their projection, then plain dot products "
            "(OPT, BioGPT: the rounding their code has)"),
    ArgSpec("divide_scores", "bool", None, doc="eager: the scores are divided by sqrt(head_dim) rather than "
            "multiplied by its inverse, which rounds otherwise (Falcon's eager op)"),
)
_ATTENTION_LAYOUT = (
    ArgSpec("fused", "enum", "none", choices=QKV_LAYOUTS,
            doc="none: separate q/k/v; stacked: one matrix [q; k; v]; heads: q, k, v interleaved per head; "
                "qvk_groups: qkv_groups row groups, each [q; v; k] of its share of the heads (CodeGen)"),
    ArgSpec("conv1d", "bool", False, doc="weights stored [in, out] (GPT-2's Conv1D)"),
    ArgSpec("qk_norm", "enum", "none", choices=QK_NORMS,
            doc="a norm on queries and keys after projection (l2norm: each head to unit length after RoPE, as nGPT)"),
    ArgSpec("qk_norm_axis", "enum", "head", choices=("head", "width"), doc="normalise each head, or all heads"),
    ArgSpec("qk_norm_eps", "expr", Num(1e-6)),
    ArgSpec("qk_norm_cast", "enum", "before_weight", choices=CASTS),
    ArgSpec("qk_scale", "bool", None, doc="nGPT's s_qk: a learned gain per query channel (heads * head_dim) on q "
            "and k after their norm and RoPE, stored at 1/sqrt(width) and applied times sqrt(width)"),
    _name("q", "the query projection's name"), _name("k", "the key projection's name"),
    _name("v", "the value projection's name"), _name("qkv", "the fused projection's name"),
    _name("o", "the output projection's name (o_proj, out_proj, dense, c_proj, …)"),
    _name("q_norm", "the query norm's name"), _name("k_norm", "the key norm's name"),
    ArgSpec("qk_norm_offset", "expr", None, doc="with qk_norm=rmsnorm: the gain is offset + weight (Gemma 3: 1); "
            "unset: 0"),
    ArgSpec("qkv_groups", "expr", None, doc="with fused=qvk_groups: the number of row groups (CodeGen's mp_num, 4); "
            "unset: 1"),
)

KINDS: dict[str, KindSpec] = {
    k.name: k
    for k in (
        *(f.spec() for f in FAMILIES.values()),
        KindSpec("self_attention", "branch", (
            ArgSpec("heads", "expr"), ArgSpec("kv_heads", "expr", None), ArgSpec("head_dim", "expr", None),
            ArgSpec("causal", "bool", True), ArgSpec("rope", "bool", False),
            ArgSpec("rope_theta", "expr", Num(10000.0)),
            ArgSpec("bias", "bool", False), ArgSpec("out_bias", "bool", False), *_BRANCH_INIT,
            ArgSpec("rope_style", "enum", "half", choices=ROPE_STYLES,
                    doc="half: pair i with i + r/2 (LLaMA); interleaved: pair 2i with 2i + 1 (GPT-J)"),
            ArgSpec("rotary_dim", "expr", None, doc="coordinates per head that rotate (partial rotary); all if unset; 0: none"),
            *_ATTENTION_CORE, ArgSpec("window", "expr", None, doc="sliding window: query i sees keys j > i - window; 0: none"),
            *_ATTENTION_LAYOUT,
            ArgSpec("head_scale", "bool", None, doc="a learned scale per head, initialised to 1, on each head's "
                    "output before the output projection (NormFormer); unset means none"),
            ArgSpec("alibi", "bool", False, doc="ALiBi: add slope_h × (key position) to the scores, positions "
                    "counted over the kept keys (BLOOM)"),
            # unset keeps the printed contract of files written before these existed
            ArgSpec("rope_freqs", "enum", None, choices=("f32", "input"),
                    doc="input: inverse frequencies rounded to the input dtype first (an HF rotary buffer cast "
                        "by model.to(dtype)); unset: f32"),
            ArgSpec("rope_f32", "bool", None, doc="true: rotate with f32 tables, then cast back (OLMo 2)"),
            ArgSpec("rope_scaling", "enum", None, choices=ROPE_SCALINGS,
                    doc="context extension: linear (position interpolation), llama3, yarn, dynamic (NTK base grown "
                        "with the sequence), longrope (per-frequency factors); unset: none"),
            ArgSpec("rope_factor", "expr", None, doc="the extension factor of rope_scaling"),
            ArgSpec("rope_original_max", "expr", None, doc="the context before extension (llama3, yarn, longrope; "
                    "dynamic: the length past which the base grows)"),
            ArgSpec("rope_low_freq", "expr", None, doc="llama3: low_freq_factor; unset: 1"),
            ArgSpec("rope_high_freq", "expr", None, doc="llama3: high_freq_factor; unset: 4"),
            ArgSpec("rope_beta_fast", "expr", None, doc="yarn: beta_fast; unset: 32"),
            ArgSpec("rope_beta_slow", "expr", None, doc="yarn: beta_slow; unset: 1"),
            ArgSpec("rope_attention_factor", "expr", None,
                    doc="yarn, longrope: cos/sin multiplied by this; unset: 0.1 ln(rope_factor) + 1 (yarn), "
                        "sqrt(1 + ln(rope_factor) / ln(rope_original_max)) (longrope)"),
            ArgSpec("rope_short_factor", "numbers", None,
                    doc="longrope: one divisor per frequency while the longest position is within rope_original_max"),
            ArgSpec("rope_long_factor", "numbers", None, doc="longrope: one divisor per frequency past it"),
            ArgSpec("rope_recache", "bool", None,
                    doc="longrope: generation drops its cache once, when the sequence first passes "
                        "rope_original_max, and recomputes every position with the long factors (Phi-3's "
                        "generation); unset: cached keys keep the factors they were rotated with"),
            ArgSpec("scores_f32", "bool", None, doc="with impl=eager: q and k cast to f32 before the score matmul, so the scores, mask and softmax are f32, and the probabilities are cast to the values' dtype (GPT-J, GPT-Neo); unset: scores in the input dtype"),
            ArgSpec("kv_broadcast", "bool", None, doc="true: keys and values are broadcast to every query head right after the projection, so each head's key is rotated on its own and, with kv_cache, stored as its own copy (Falcon's new architecture); unset: grouped heads read their shared key"),
            ArgSpec("rope_tables", "enum", None, choices=("f32", "input"), doc="with rope_f32=true: input: the cos/sin tables are rounded to the input dtype, and q and k cast to f32, before the rotation (Cohere); unset: f32 tables, q and k as projected")),
            "multi-head / grouped-query self-attention (q_proj, k_proj, v_proj, o_proj)",
            (Implies("rope", False, "rope_theta", Num(10000.0), "rope_theta sets the rotary base; rope=false "
                     "rotates nothing"),
             Implies("alibi", True, "scale_query", False, "ALiBi attention scales the scores, as BLOOM does"),
             *_UNFUSED_V, *_COUNTED)),
        KindSpec("cross_attention", "branch", (
            ArgSpec("heads", "expr"), ArgSpec("kv_heads", "expr", None), ArgSpec("head_dim", "expr", None),
            ArgSpec("bias", "bool", False), ArgSpec("out_bias", "bool", False), *_BRANCH_INIT,
            *_ATTENTION_CORE, *_ATTENTION_LAYOUT),
            "queries from the state, keys and values from memory", (*_UNFUSED_V, *_COUNTED)),
        KindSpec("mlp", "branch", (
            ArgSpec("hidden", "dim", positional=True), ArgSpec("act", "enum", "gelu", choices=ACTIVATIONS),
            ArgSpec("bias", "bool", True), *_BRANCH_INIT,
            _name("fc1", "the input layer's name (c_fc, dense_h_to_4h, up_proj, …)"),
            _name("fc2", "the output layer's name (c_proj, dense_4h_to_h, down_proj, …)"),
            ArgSpec("conv1d", "bool", False, doc="weights stored [in, out] (GPT-2's Conv1D)")),
            "dense MLP fc2(act(fc1(x)))"),
        KindSpec("gated_mlp", "branch", (
            ArgSpec("hidden", "dim", positional=True), ArgSpec("act", "enum", "silu", choices=ACTIVATIONS),
            ArgSpec("bias", "bool", False), *_BRANCH_INIT,
            _name("gate", "the gate layer's name"), _name("up", "the up layer's name"),
            _name("down", "the down layer's name"),
            ArgSpec("fused", "bool", False, doc="gate and up stored as one matrix, gate rows first"),
            _name("gate_up", "the fused gate and up layer's name")),
            "gated MLP down(act(gate(x)) * up(x))"),
        KindSpec("moe", "branch", (
            ArgSpec("hidden", "dim", positional=True, doc="each expert's hidden width"),
            ArgSpec("experts", "expr", doc="the number of experts"),
            ArgSpec("top_k", "expr", doc="the experts each token is routed to, from 1 to experts"),
            ArgSpec("act", "enum", "silu", choices=ACTIVATIONS, doc="each expert is down(act(gate(x)) * up(x))"),
            ArgSpec("routing", "enum", "softmax_topk", choices=ROUTINGS,
                    doc="softmax_topk: the router's softmax over all experts, then the k largest (Mixtral, Qwen, "
                        "OLMoE); topk_softmax: the k largest logits, then their softmax"),
            ArgSpec("norm_topk", "bool", False, doc="the k weights divided by their sum (Mixtral; Qwen's and "
                    "OLMoE's norm_topk_prob)"),
            ArgSpec("weights", "enum", "f32", choices=("f32", "input"),
                    doc="the routing weights scale the experts' outputs in f32 (Mixtral), or rounded to the input "
                        "dtype first (Qwen, OLMoE)"),
            ArgSpec("shared", "dim", None, doc="the hidden width of a shared gated expert every token passes, "
                    "added to the routed experts' sum (Qwen2-MoE); unset: none"),
            ArgSpec("shared_gate", "bool", False, doc="the shared expert's output scaled by sigmoid(linear(x)), "
                    "one learned logit per token (Qwen2-MoE)"),
            _name("router", "the router's name (a linear D -> experts without bias)"),
            _name("experts_name", "the experts' name: they hold gate_up_proj [experts, 2 * hidden, D], the gate "
                  "rows first, and down_proj [experts, D, hidden]"),
            _name("shared_expert", "the shared expert's name (a gated_mlp)"),
            _name("shared_expert_gate", "the shared expert's gate's name")),
            "mixture of experts: each token's sum of its top_k gated-MLP experts, weighted by the router"),
        KindSpec("linear", "linear", (
            ArgSpec("in_dim", "dim", positional=True), ArgSpec("out_dim", "dim", positional=True),
            ArgSpec("bias", "bool", True)), "a dense projection over the last axis"),
        KindSpec("embedding", "embedding", (
            ArgSpec("vocab", "dim", positional=True, doc="rows of the table: the vocabulary, or the positions"),
            ArgSpec("width", "dim", positional=True),
            ArgSpec("positions", "bool", False, doc="look up positions 0..S-1 instead of the token ids (GPT-2's wpe)"),
            ArgSpec("scale", "expr", None, doc="multiply the rows by this, in the table's dtype (Gemma: D ** 0.5)"),
            ArgSpec("position_offset", "expr", Num(0), doc="with positions=true, look up rows offset..offset+S-1 "
                    "(RoBERTa: pad_token_id + 1)"),
            ArgSpec("mask_positions", "bool", False, doc="with positions=true, number the tokens the [B, S] "
                    "attention_mask keeps 0, 1, … and padded ones -1, before the offset (OPT, BioGPT)"),
            ArgSpec("padding_idx", "expr", None, doc="the row of the pad token, which gets no gradient "
                    "(nn.Embedding's padding_idx)"),
            ArgSpec("init_std", "expr", None, doc="the table is drawn from N(0, init_std^2) (T-Fixup: width ** -0.5); "
                    "unset: N(0, 0.02^2)"),
            ArgSpec("init_gain", "expr", None, doc="then multiplied by this (T-Fixup: (9 N) ** -0.25 for N layers)")),
            "a lookup table applied to token ids [B, S]: returns [B, S, width]"),
        KindSpec("head", "head", (
            ArgSpec("vocab", "dim", positional=True), ArgSpec("bias", "bool", False),
            ArgSpec("tied", "bool", False, doc="share the weight of the token embedding declared in the same model"),
            ArgSpec("softcap", "expr", None, doc="logits become softcap * tanh(logits / softcap) (Gemma 2)"),
            ArgSpec("shared_bias", "decl", None, choices=("shift",),
                    doc="the bias is the vector of this bias(V) declaration of the same block, one tensor under both "
                        "names (HF's masked-LM heads: cls.predictions.bias is cls.predictions.decoder.bias)")),
            "the output projection to vocabulary logits (HF's lm_head)",
            (Implies("bias", False, "shared_bias", None, "a head without a bias has none to share"),)),
        KindSpec("scalar", "scale", (ArgSpec("init", "expr", Num(1.0)), _offset("the scalar")),
                 "a learned scalar gain (ReZero: init=0)"),
        KindSpec("vector", "scale", (ArgSpec("axis", "dim", positional=True), ArgSpec("init", "expr", Num(1.0)),
                                     _offset("the vector")),
                 "a learned per-channel gain (LayerScale)"),
        KindSpec("bias", "shift", (ArgSpec("axis", "dim", None, positional=True,
                                           doc="the channel axis; unset: one scalar bias (Fixup)"),
                                   ArgSpec("init", "expr", Num(0.0))),
                 "a learned per-channel bias added to a value"),
        KindSpec("activation", "activation", (ArgSpec("fn", "enum", choices=ACTIVATIONS, positional=True),),
                 "a named activation function"),
    )
}

# Functions usable inside equations (not declarations).
FUNCTIONS = ("dropout", "drop_path", "layer_drop", "cast", "concat", "zeros") + ACTIVATIONS + GATES

# The default name of each named layer inside a built-in branch; the key table and the backend both read it.
LAYER_NAMES: dict[str, dict[str, str]] = {
    "self_attention": {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "qkv": "qkv_proj",
                       "q_norm": "q_norm", "k_norm": "k_norm"},
    "mlp": {"fc1": "fc1", "fc2": "fc2"},
    "gated_mlp": {"gate": "gate_proj", "up": "up_proj", "down": "down_proj", "gate_up": "gate_up_proj"},
    "moe": {"router": "gate", "experts_name": "experts", "shared_expert": "shared_expert",
            "shared_expert_gate": "shared_expert_gate"},
}
LAYER_NAMES["cross_attention"] = LAYER_NAMES["self_attention"]


def layer_names(kind: str, args: Any) -> dict[str, str]:
    """Role -> parameter name inside a branch declaration; ``args`` maps argument names to values."""
    return {role: args.get(role) or name for role, name in LAYER_NAMES.get(kind, {}).items()}
