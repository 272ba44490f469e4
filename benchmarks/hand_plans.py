"""Hand-written tensor-parallel plans of the imported HF causal LMs, as torchtitan and HF's ``tp_plan`` write them.

Each plan is a ``parallelize_module`` dict of PyTorch's own styles (``ColwiseParallel``, ``RowwiseParallel``,
``SequenceParallel``, ``PrepareModuleInput``) on the submodules of the module ``blockir.compile`` returns, under
the HF names the importer keeps. Two layouts, the two a hand author writes:

* ``sequence``: torchtitan's ``parallelize_llama``: norms ``SequenceParallel``, each branch's input gathered by
  ``PrepareModuleInput``, the row-parallel output reduce-scattered onto ``Shard(1)``;
* ``replicated``: Megatron-LM's, and what HF's ``base_model_tp_plan`` says (``colwise`` / ``rowwise``): the
  stream replicated, each row-parallel output all-reduced.

Both split the token table and the head by vocabulary (torchtitan's ``RowwiseParallel`` on the embedding and
``ColwiseParallel(output_layouts=Shard(-1))`` on the head, the loss under ``loss_parallel``; Megatron-LM's
vocab-parallel embedding and cross-entropy); a tied head is tied again after the split, as HF's
``tie_weights`` does. A custom style appears only where the stored layout forces one, as HF writes it:

* GPT-2's ``Conv1D`` stores ``[in, out]``, which ``ColwiseParallel`` / ``RowwiseParallel`` refuse (they take an
  ``nn.Linear``): ``PackedColumns`` and ``ConvRows`` split it along its other axis;
* equal blocks packed along the output features (Phi-3's and GLM's ``gate_up_proj``, GPT-2's ``c_attn`` with as many
  key/value heads as query heads): HF's ``PackedColwiseParallel`` (``packed_colwise``), each block split over
  the ranks by ``_StridedShard(split_factor=blocks)``; the branch then holds its rank's heads, which the author
  sets on it (as HF's ``get_kv_heads_per_rank`` does);
* Phi-3's ``qkv_proj``, whose q block is wider than its k and v blocks (grouped key/value heads), has no
  strided split: HF's ``Phi3Config.base_model_tp_plan`` gathers its output (``colwise_gather_output``) and
  splits ``o_proj``'s input again (``rowwise_split_input``); every rank runs the attention on all heads;
* OLMo-2 normalises q and k over the whole width: ``Olmo2Config.base_model_tp_plan`` gathers q, k and v
  (``colwise_gather_output``) and splits ``o_proj``'s input, so each norm sees whole rows;
* GPT-NeoX's ``query_key_value`` holds q, k, v per head in turn: HF's plan splits it ``colwise``, which cuts
  it into whole heads;
* a mixture of experts (Mixtral, Qwen2-MoE) is split by hidden units inside every expert, as torchtitan's MoE
  tensor parallelism and HF's ``local_packed_rowwise`` / ``local_rowwise`` experts store it, between torchtitan's
  ``PrepareModuleInputOutput`` (the stream gathered in, the pending sum reduced out); the experts run on local
  tensors, which no PyTorch style provides (``LocalExperts``);
* CodeGen's ``qkv_proj`` holds 4 row groups, each q, v, k of a quarter of the heads (HF's fixed ``mp_num``): a
  degree that divides 4 cuts it ``colwise`` into whole groups, and the author sets the rank's heads and groups
  on the branch (``CodeGenConfig`` has no ``base_model_tp_plan``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput,
                                               PrepareModuleInputOutput, PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)
from torch.distributed.tensor.placement_types import _StridedShard

from blockir.lower.layers.dense import Conv1D

LAYOUTS = ("sequence", "replicated")


class PackedColumns(ParallelStyle):
    """HF's ``PackedColwiseParallel`` for an ``nn.Linear`` or a transposed ``Conv1D``: the output features are
    ``blocks`` equal blocks, each split over the ranks (one block: a plain ``Shard``), so each rank computes its
    part of every block; the input arrives replicated and its gradient is a pending sum. (HF shards a packed bias
    plainly; here it is strided like the weight, which a packed bias needs.)"""

    def __init__(self, blocks: int = 1) -> None:
        super().__init__()
        self.blocks = blocks

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        out = 1 if isinstance(module, Conv1D) else 0
        split = (lambda dim: _StridedShard(dim, split_factor=self.blocks)) if self.blocks > 1 else Shard
        for name, p in list(module.named_parameters(recurse=False)):
            placement = split(out if name == "weight" else 0)
            module.register_parameter(name, nn.Parameter(distribute_tensor(p.data, device_mesh, [placement],
                                                                           src_data_rank=None)))

        def forward(x: torch.Tensor) -> torch.Tensor:
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
            if x.placements != (Replicate(),):  # a no-op redistribute would all-reduce the pending gradient
                x = x.redistribute(device_mesh, [Replicate()])
            x = x.to_local(grad_placements=[Partial()])
            w = module.weight.to_local()
            b = module.bias.to_local() if module.bias is not None else None
            if out == 0:
                return F.linear(x, w, b)
            return x @ w if b is None else x @ w + b

        module.forward = forward  # type: ignore[method-assign]
        return module


class ConvRows(ParallelStyle):
    """``RowwiseParallel`` for a transposed ``Conv1D``: the weight split by input features (its rows), each rank's
    product a pending sum brought to ``output_layouts``, then the replicated bias added once."""

    def __init__(self, output_layouts: Any = None) -> None:
        super().__init__()
        self.output = output_layouts or Replicate()

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        for name, p in list(module.named_parameters(recurse=False)):
            placement = Shard(0) if name == "weight" else Replicate()
            module.register_parameter(name, nn.Parameter(distribute_tensor(p.data, device_mesh, [placement])))

        def forward(x: torch.Tensor) -> torch.Tensor:
            if isinstance(x, DTensor):
                x = x.redistribute(device_mesh, [Shard(-1)]).to_local()
            y = DTensor.from_local(x @ module.weight.to_local(), device_mesh, [Partial()], run_check=False)
            y = y.redistribute(device_mesh, [self.output])
            if module.bias is not None:
                y = y + module.bias
            return y.to_local()

        module.forward = forward  # type: ignore[method-assign]
        return module


def _gather() -> PrepareModuleInput:
    """torchtitan's branch input: the sequence-sharded stream gathered to full rows."""
    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))


def _decoder(sp: bool, *, out: str = "o_proj", up: tuple[str, ...] = ("gate_proj", "up_proj"), down: str = "down_proj",
             packed: bool = False, pre: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm"),
             post: tuple[str, ...] = (), attn: str = "self_attn") -> dict[str, ParallelStyle]:
    """torchtitan's decoder layer (HF's ``colwise`` / ``rowwise`` without the sequence split) under the names a family
    keeps: q, k, v and ``up`` column-parallel (``packed``: one matrix of the gate and up blocks, HF's
    ``packed_colwise``), ``out`` and ``down`` row-parallel. Under the sequence split each branch's input is
    gathered, the norms ``pre`` that feed the branches (one for a parallel residual, none where the branches read
    the stream) are ``SequenceParallel``, and those ``post`` on a branch's output hand back local tensors, as the
    residual add's other operand is (OLMo-2's sandwich); ``attn`` is the attention branch."""
    stream = Shard(1) if sp else Replicate()
    plan: dict[str, ParallelStyle] = {f"{attn}.{name}": ColwiseParallel() for name in ("q_proj", "k_proj", "v_proj")}
    plan[f"{attn}.{out}"] = RowwiseParallel(output_layouts=stream)
    plan |= {f"mlp.{name}": PackedColumns(blocks=2) if packed else ColwiseParallel() for name in up}
    plan[f"mlp.{down}"] = RowwiseParallel(output_layouts=stream)
    if sp:
        plan |= {norm: SequenceParallel() for norm in pre} | {attn: _gather(), "mlp": _gather()}
        plan |= {norm: SequenceParallel(use_local_output=True) for norm in post}
    return plan


def _llama(sp: bool) -> dict[str, ParallelStyle]:
    """LLaMA and the families that keep its layer's names (Qwen2, Mistral, Qwen3 with its per-head q/k norms, Granite
    with its multipliers, Gemma, Helium, Seed-OSS, SmolLM3, OLMo, Ministral, StableLM, CWM, ERNIE 4.5): torchtitan's
    decoder layer."""
    return _decoder(sp)


def _opt(sp: bool) -> dict[str, ParallelStyle]:
    """OPT: the MLP's linears sit on the layer itself, so ``fc1`` gathers its own input (``ColwiseParallel`` from
    the stream's layout) and ``fc2`` reduces onto the stream; the attention as torchtitan's."""
    stream = Shard(1) if sp else Replicate()
    plan: dict[str, ParallelStyle] = {f"self_attn.{name}": ColwiseParallel() for name in ("q_proj", "k_proj", "v_proj")}
    plan |= {"self_attn.out_proj": RowwiseParallel(output_layouts=stream), "fc1": ColwiseParallel(input_layouts=stream),
             "fc2": RowwiseParallel(output_layouts=stream)}
    if sp:
        plan |= {"self_attn_layer_norm": SequenceParallel(), "self_attn": _gather(), "final_layer_norm": SequenceParallel()}
    return plan


def _phi3(sp: bool) -> dict[str, ParallelStyle]:
    """Phi-3: the stacked q/k/v gathered (HF's ``colwise_gather_output``, ``rowwise_split_input``), the stacked
    gate/up split as two packed blocks (HF's ``packed_colwise``)."""
    out = Shard(1) if sp else Replicate()
    plan: dict[str, ParallelStyle] = {
        "self_attn.qkv_proj": ColwiseParallel(output_layouts=Replicate()),
        "self_attn.o_proj": RowwiseParallel(input_layouts=Replicate(), output_layouts=out),
        "mlp.gate_up_proj": PackedColumns(blocks=2), "mlp.down_proj": RowwiseParallel(output_layouts=out)}
    if sp:
        plan |= {"input_layernorm": SequenceParallel(), "self_attn": _gather(),
                 "post_attention_layernorm": SequenceParallel(), "mlp": _gather()}
    return plan


def _olmo2(sp: bool) -> dict[str, ParallelStyle]:
    """OLMo-2: ``Olmo2Config.base_model_tp_plan``: q, k and v gathered so the width norms see whole rows, o's input
    split again; the MLP ``colwise`` / ``rowwise``. Its norms follow the branches and feed the residual add, so
    under the sequence split they hand back local tensors, as the add's other operand is."""
    out = Shard(1) if sp else Replicate()
    plan: dict[str, ParallelStyle] = {
        "self_attn.q_proj": ColwiseParallel(output_layouts=Replicate()),
        "self_attn.k_proj": ColwiseParallel(output_layouts=Replicate()),
        "self_attn.v_proj": ColwiseParallel(output_layouts=Replicate()),
        "self_attn.o_proj": RowwiseParallel(input_layouts=Replicate(), output_layouts=out),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=out)}
    if sp:
        plan |= {"self_attn": _gather(), "post_attention_layernorm": SequenceParallel(use_local_output=True),
                 "mlp": _gather(), "post_feedforward_layernorm": SequenceParallel(use_local_output=True)}
    return plan


def _gpt2(sp: bool) -> dict[str, ParallelStyle]:
    """GPT-2: transposed ``Conv1D`` weights; ``c_attn`` holds q, k, v as three equal blocks."""
    out = Shard(1) if sp else Replicate()
    plan: dict[str, ParallelStyle] = {
        "attn.c_attn": PackedColumns(blocks=3), "attn.c_proj": ConvRows(out),
        "mlp.c_fc": PackedColumns(), "mlp.c_proj": ConvRows(out)}
    if sp:
        plan |= {"ln_1": SequenceParallel(), "attn": _gather(), "ln_2": SequenceParallel(), "mlp": _gather()}
    return plan


def _gpt_neox(sp: bool) -> dict[str, ParallelStyle]:
    """GPT-NeoX: HF's plan, ``query_key_value`` and ``dense_h_to_4h`` ``colwise``, ``dense`` and
    ``dense_4h_to_h`` ``rowwise``; both norms read the layer's input (a parallel residual)."""
    out = Shard(1) if sp else Replicate()
    plan: dict[str, ParallelStyle] = {
        "attention.query_key_value": ColwiseParallel(), "attention.dense": RowwiseParallel(output_layouts=out),
        "mlp.dense_h_to_4h": ColwiseParallel(), "mlp.dense_4h_to_h": RowwiseParallel(output_layouts=out)}
    if sp:
        plan |= {"input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                 "attention": _gather(), "mlp": _gather()}
    return plan


def _codegen(sp: bool) -> dict[str, ParallelStyle]:
    """CodeGen: ``qkv_proj`` ``colwise`` (whole row groups per rank), ``fc_in`` ``colwise``, ``out_proj`` and
    ``fc_out`` ``rowwise``; one norm feeds both branches (GPT-J's parallel residual), each gathering its output."""
    out = Shard(1) if sp else Replicate()
    plan: dict[str, ParallelStyle] = {
        "attn.qkv_proj": ColwiseParallel(), "attn.out_proj": RowwiseParallel(output_layouts=out),
        "mlp.fc_in": ColwiseParallel(), "mlp.fc_out": RowwiseParallel(output_layouts=out)}
    if sp:
        plan |= {"ln_1": SequenceParallel(), "attn": _gather(), "mlp": _gather()}
    return plan


class LocalExperts(ParallelStyle):
    """A mixture of experts split by hidden units inside every expert, as torchtitan's MoE tensor parallelism and HF's
    ``local_packed_rowwise`` / ``local_rowwise`` experts store it: each expert's gate rows and up rows (its slice of
    each block of ``gate_up_proj``) and its down columns, a shared expert split as a gated MLP, the router and the
    shared expert's gate replicated. The branch runs on local tensors; its input arrives a replicated DTensor and
    its output leaves a pending sum (``PrepareModuleInputOutput`` around it gathers and reduces them once). A
    replicated weight, and the input, are read with pending-sum gradients: each rank's is its summand, the routing
    weights multiplying this rank's partial outputs."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self.stream = stream

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        mesh = device_mesh

        def place(owner: nn.Module, name: str, placement: Any) -> None:
            owner.register_parameter(name, nn.Parameter(distribute_tensor(getattr(owner, name).data, mesh,
                                                                          [placement], src_data_rank=None)))

        def local(linear: nn.Module, placement: Any) -> None:
            assert linear.bias is None, "the MoE linears of these families have no bias"
            place(linear, "weight", placement)
            grad = [Partial()] if placement == Replicate() else None
            linear.forward = lambda x: F.linear(x, linear.weight.to_local(grad_placements=grad))

        local(module.get_submodule(module.names["router"]), Replicate())
        if module.has_shared:
            shared = module.get_submodule(module.names["shared"])
            for role, placement in (("gate", Shard(0)), ("up", Shard(0)), ("down", Shard(1))):
                local(shared.get_submodule(shared.names[role]), placement)
            if module.has_gate:
                local(module.get_submodule(module.names["shared_gate"]), Replicate())
        experts = module.get_submodule(module.names["experts"])
        place(experts, "gate_up_proj", _StridedShard(1, split_factor=2))
        place(experts, "down_proj", Shard(2))
        experts.matrices = lambda: (experts.gate_up_proj.to_local(), experts.down_proj.to_local())
        forward = module.forward
        module.forward = lambda x, **ctx: forward(x.to_local(grad_placements=[Partial()]), **ctx)
        return PrepareModuleInputOutput(input_layouts=(self.stream,), desired_input_layouts=(Replicate(),),
                                        output_layouts=(Partial(),), desired_output_layouts=(self.stream,),
                                        use_local_output=True)._apply(module, mesh)


def _moe(sp: bool, key: str = "mlp", attention: Callable[[bool], dict[str, ParallelStyle]] | None = None
         ) -> dict[str, ParallelStyle]:
    """A mixture of experts at ``key`` split inside every expert (``LocalExperts``), the stream gathered into it and
    its pending sum reduced onto the stream; LLaMA's attention and norms (``attention``: the attention of that
    plan instead, OLMoE's q, k, v gathered for its norms over the whole width as OLMo-2's plan does)."""
    plan = {k: v for k, v in _llama(sp).items() if not k.startswith(("mlp", "self_attn."))}
    plan |= {k: v for k, v in (attention or _llama)(sp).items() if k.startswith("self_attn.")}
    plan[key] = LocalExperts(Shard(1) if sp else Replicate())
    return plan


@dataclass(frozen=True)
class Family:
    block: str  # the causal LM's block in the importer's text
    layers: str  # the stack's path
    embedding: str
    norm: str  # the final norm
    layer: Callable[[bool], dict[str, ParallelStyle]]
    positions: str | None = None  # a learned position table (GPT-2's wpe)
    packed_attention: str | None = None  # a branch whose packed q/k/v the author splits by heads

    def config(self, model_type: str, *, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
               vocab: int, seq: int) -> dict[str, Any]:
        """An HF config dict of ``model_type`` at these sizes (no weights read)."""
        if model_type == "opt":  # Pre-LN, no projection of the embedding
            return dict(model_type=model_type, vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                        ffn_dim=intermediate, num_attention_heads=heads, max_position_embeddings=seq,
                        word_embed_proj_dim=hidden, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                        pad_token_id=1)
        if model_type in ("gpt2", "codegen", "gptj"):
            # CodeGen and GPT-J rotate part of each head's features (CodeGen half, as its released models do)
            rotary = {"codegen": dict(rotary_dim=hidden // heads // 2, n_ctx=seq),
                      "gptj": dict(rotary_dim=hidden // heads // 2)}.get(model_type, {})
            return dict(model_type=model_type, vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                        n_positions=seq, n_inner=intermediate, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        **rotary)
        common = dict(model_type=model_type, vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, max_position_embeddings=seq)
        head = hidden // heads  # Qwen3's and Gemma's configs default to heads wider than that
        extra = {"llama": dict(num_key_value_heads=kv_heads, rms_norm_eps=1e-6),
                 "qwen2": dict(num_key_value_heads=kv_heads, tie_word_embeddings=True),
                 "mistral": dict(num_key_value_heads=kv_heads, sliding_window=None),
                 "qwen3": dict(num_key_value_heads=kv_heads, head_dim=head),
                 "granite": dict(num_key_value_heads=kv_heads, embedding_multiplier=12.0, residual_multiplier=0.22,
                                 attention_multiplier=1 / head, logits_scaling=8.0),
                 "gemma": dict(num_key_value_heads=kv_heads, head_dim=head),
                 "gpt_neox": dict(rotary_pct=0.25, use_parallel_residual=True),
                 "phi3": dict(num_key_value_heads=kv_heads, pad_token_id=0),
                 "olmo2": dict(num_key_value_heads=kv_heads),
                 # the further families that keep LLaMA's layer and its names
                 **{name: dict(num_key_value_heads=kv_heads, head_dim=head) for name in ("helium", "olmo")},
                 "ministral": dict(num_key_value_heads=kv_heads, head_dim=head, sliding_window=None),
                 "smollm3": dict(num_key_value_heads=kv_heads, pad_token_id=0),
                 "seed_oss": dict(num_key_value_heads=kv_heads, head_dim=head, attention_dropout=0.0,
                                  residual_dropout=0.0),
                 "stablelm": dict(num_key_value_heads=kv_heads),
                 "arcee": dict(num_key_value_heads=kv_heads, pad_token_id=0),
                 "nemotron": dict(num_key_value_heads=kv_heads, pad_token_id=0),
                 "starcoder2": dict(num_key_value_heads=kv_heads, sliding_window=None),
                 "glm": dict(num_key_value_heads=kv_heads, head_dim=head, pad_token_id=0),
                 **{name: dict(num_key_value_heads=kv_heads, pad_token_id=0) for name in ("cohere", "cohere2", "jais2")},
                 **{name: dict(num_key_value_heads=kv_heads, head_dim=head, pad_token_id=0)
                    for name in ("gemma2", "gemma3_text", "vaultgemma", "glm4")},
                 **{name: dict(num_key_value_heads=kv_heads) for name in ("cwm", "hyperclovax", "exaone4")},
                 "olmo3": dict(num_key_value_heads=kv_heads, pad_token_id=0),
                 "phi": dict(pad_token_id=0),
                 "ernie4_5": dict(num_key_value_heads=kv_heads, head_dim=head, pad_token_id=0),
                 "qwen3_moe": dict(num_key_value_heads=kv_heads, head_dim=head, num_experts=4, num_experts_per_tok=2,
                                   moe_intermediate_size=intermediate, norm_topk_prob=True),
                 "olmoe": dict(num_key_value_heads=kv_heads, num_experts=4, num_experts_per_tok=2, pad_token_id=0),
                 "granitemoe": dict(num_key_value_heads=kv_heads, num_local_experts=4, num_experts_per_tok=2),
                 # 4 experts, each token routed to 2; Qwen2-MoE's shared expert as wide as one of them
                 "mixtral": dict(num_key_value_heads=kv_heads, num_local_experts=4, num_experts_per_tok=2,
                                 sliding_window=None),
                 "qwen2_moe": dict(num_key_value_heads=kv_heads, num_experts=4, num_experts_per_tok=2,
                                   moe_intermediate_size=intermediate, shared_expert_intermediate_size=intermediate)
                 }[model_type]
        return dict(common, **extra)


FAMILIES = {
    "llama": Family("LlamaForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _llama),
    "qwen2": Family("Qwen2ForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _llama),
    "mistral": Family("MistralForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _llama),
    "qwen3": Family("Qwen3ForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _llama),
    "granite": Family("GraniteForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _llama),
    "gemma": Family("GemmaForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _llama),
    "gpt2": Family("GPT2LMHeadModel", "transformer.h", "transformer.wte", "transformer.ln_f", _gpt2,
                   positions="transformer.wpe", packed_attention="attn"),
    "gpt_neox": Family("GPTNeoXForCausalLM", "gpt_neox.layers", "gpt_neox.embed_in", "gpt_neox.final_layer_norm",
                       _gpt_neox),
    "phi3": Family("Phi3ForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _phi3),
    "olmo2": Family("Olmo2ForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _olmo2),
    "codegen": Family("CodeGenForCausalLM", "transformer.h", "transformer.wte", "transformer.ln_f", _codegen,
                      packed_attention="attn"),
    **{name: Family(f"{cls}ForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _llama)
       for name, cls in (("helium", "Helium"), ("seed_oss", "SeedOss"), ("smollm3", "SmolLM3"), ("olmo", "Olmo"),
                         ("ministral", "Ministral"), ("stablelm", "StableLm"), ("cwm", "Cwm"),
                         ("ernie4_5", "Ernie4_5"))},
    # a ReLU² MLP of up and down alone
    **{name: Family(f"{cls}ForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                    partial(_decoder, up=("up_proj",))) for name, cls in (("arcee", "Arcee"), ("nemotron", "Nemotron"))},
    "starcoder2": Family("Starcoder2ForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                         partial(_decoder, up=("c_fc",), down="c_proj")),
    "glm": Family("GlmForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                  partial(_decoder, up=("gate_up_proj",), packed=True)),
    # one norm feeding both branches (a parallel residual)
    **{name: Family(f"{cls}ForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                    partial(_decoder, pre=("input_layernorm",))) for name, cls in (("cohere", "Cohere"),
                                                                                   ("cohere2", "Cohere2"))},
    "phi": Family("PhiForCausalLM", "model.layers", "model.embed_tokens", "model.final_layernorm",
                  partial(_decoder, out="dense", up=("fc1",), down="fc2", pre=("input_layernorm",))),
    "jais2": Family("Jais2ForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                    partial(_decoder, up=("up_proj",))),
    # norms on the branches' outputs too (sandwich), or on them alone
    **{name: Family(f"{cls}ForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                    partial(_decoder, pre=("input_layernorm", "pre_feedforward_layernorm"),
                            post=("post_attention_layernorm", "post_feedforward_layernorm")))
       for name, cls in (("gemma2", "Gemma2"), ("gemma3_text", "Gemma3"))},
    "vaultgemma": Family("VaultGemmaForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                         partial(_decoder, pre=("input_layernorm", "pre_feedforward_layernorm"))),
    "glm4": Family("Glm4ForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                   partial(_decoder, up=("gate_up_proj",), packed=True,
                           post=("post_self_attn_layernorm", "post_mlp_layernorm"))),
    "hyperclovax": Family("HyperCLOVAXForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                          partial(_decoder, post=("post_norm1", "post_norm2"))),
    "exaone4": Family("Exaone4ForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                      partial(_decoder, pre=(), post=("post_attention_layernorm", "post_feedforward_layernorm"))),
    "olmo3": Family("Olmo3ForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _olmo2),
    "opt": Family("OPTForCausalLM", "model.decoder.layers", "model.decoder.embed_tokens", "model.decoder.final_layer_norm",
                  _opt, positions="model.decoder.embed_positions"),
    "gptj": Family("GPTJForCausalLM", "transformer.h", "transformer.wte", "transformer.ln_f",
                   partial(_decoder, attn="attn", out="out_proj", up=("fc_in",), down="fc_out", pre=("ln_1",))),
    **{name: Family(f"{cls}ForCausalLM", "model.layers", "model.embed_tokens", "model.norm", _moe)
       for name, cls in (("mixtral", "Mixtral"), ("qwen2_moe", "Qwen2Moe"), ("qwen3_moe", "Qwen3Moe"))},
    "olmoe": Family("OlmoeForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                    partial(_moe, attention=_olmo2)),
    "granitemoe": Family("GraniteMoeForCausalLM", "model.layers", "model.embed_tokens", "model.norm",
                         partial(_moe, key="block_sparse_moe")),
}


def _as_torch_tables(model: nn.Module, embedding: str) -> bool:
    """PyTorch's styles take ``nn.Embedding`` and ``nn.Linear``: the compiled table and head are handed to them
    as those, holding the same tensors. Whether the head is tied to the table."""
    owner, _, leaf = embedding.rpartition(".")
    table, head = model.get_submodule(embedding), model.get_submodule("lm_head")
    tied = head.weight is table.weight
    lookup = nn.Embedding(*table.weight.shape, _weight=table.weight.data)
    if table.scale is not None:  # Gemma's normaliser, applied to the looked-up rows as HF's scaled embedding does
        scale = table.scale
        lookup.register_forward_hook(lambda _module, _inputs, rows: rows * scale)
    linear = nn.Linear(head.weight.shape[1], head.weight.shape[0], bias=head.bias is not None)
    linear.weight = lookup.weight if tied else nn.Parameter(head.weight.data)
    if head.bias is not None:  # GPT-J's and CodeGen's head
        linear.bias = nn.Parameter(head.bias.data)
    setattr(model.get_submodule(owner), leaf, lookup)
    model.lm_head = linear
    return tied


def hand_written_family(model: nn.Module, mesh: Any, family: str, layout: str) -> None:
    """The hand-written plan of ``family``'s causal LM (``model``, compiled from the importer's text) under
    ``layout``: vocabulary-parallel table and head, the logits left ``Shard(-1)`` for ``loss_parallel``."""
    fam, sp = FAMILIES[family], layout == "sequence"
    tied = _as_torch_tables(model, fam.embedding)
    stack = model.get_submodule(fam.layers)
    for layer in stack.children():
        parallelize_module(layer, mesh, fam.layer(sp))
        if fam.packed_attention:
            branch = layer.get_submodule(fam.packed_attention)
            vars(branch).update(heads=branch.heads // mesh.size(), kv_heads=branch.kv_heads // mesh.size())
            if branch.fused == "qvk_groups":  # the rank's whole row groups
                vars(branch).update(qkv_groups=branch.qkv_groups // mesh.size())
    top: dict[str, ParallelStyle] = {
        fam.embedding: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()),
        "lm_head": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1),
                                   use_local_output=False)}
    if sp:
        top[fam.norm] = SequenceParallel()
        if fam.positions:  # every rank looks up all positions and keeps its rows
            top[fam.positions] = PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),),
                                                      use_local_output=True)
    parallelize_module(model, mesh, top)
    if tied:  # one table: the head reads the embedding's vocabulary rows
        model.lm_head.weight = model.get_submodule(fam.embedding).weight


def hand_written(model: nn.Module, mesh: Any, layers: int) -> None:
    """torchtitan's sequence-parallel plan for a LLaMA decoder (``LlamaModel`` of examples/llama.block, stream in
    and out), under the HF module names."""
    for i in range(layers):
        parallelize_module(model.get_submodule(f"layers.{i}"), mesh, _llama(True))
    parallelize_module(model, mesh, {"norm": SequenceParallel(use_local_output=True)})
    parallelize_module(model, mesh, PrepareModuleInputOutput(
        input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_input=True,
        output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True))
