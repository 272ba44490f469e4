"""The tensor-parallel plan a block implies, derived from its declarations (no torch).

Given the residual stream's layout over one mesh axis of size P, every
declaration gets a style (Shoeybi et al., 2019; Korthikanti et al., 2022):

* attention: q/k/v split by output columns (whole heads per rank), o split by
  input rows; with more ranks than key/value heads, k/v are replicated and
  each rank computes only the key/value head its query heads read; the o
  output is reduced to the stream's layout — all-reduce for a replicated
  stream, reduce-scatter onto rows (sequence) or features (hidden); a sharded
  stream is all-gathered at the branch input;
* MLP: fc1 (gate/up) by columns, fc2 (down) by rows, reduced the same way; an MLP written out as two
  linears with elementwise functions between them (``analyses/linear_pairs.py``: OPT, BERT) splits alike, its
  first linear gathering the stream as a branch input does;
* mixture of experts: every expert split as an MLP, the router replicated on full rows, the routed (and
  shared) experts' sum reduced once (``parallel_moe.py``);
* norms: replicated parameters; under sequence sharding each rank normalizes
  its own complete rows and the affine gradients are summed over ranks;
  under hidden sharding the row moments come from one all-reduce of the row's
  partial sums (Σx² for RMSNorm, Σx and Σx² for LayerNorm), so the stream
  stays feature-sharded through a norm, Post-LN's included;
* other linears, scales, externs: replicated, gathered in and sliced out;
* embeddings and heads of a language model: replicated, computed on full
  tensors; an embedding's output is sliced to the stream's layout, a head's
  input is all-gathered (the stream is then the type of the stacked layers'
  input, not of the token ids the model takes);
* with ``vocab``, split by vocabulary rows instead (Megatron-LM's vocab-parallel
  embedding, torchtitan's loss parallelism): each rank looks up the ids of its
  rows, zero elsewhere, and the pending sum is reduced to the stream's layout
  (all-reduce, or reduce-scatter onto a shard); the head is column-parallel and
  its logits stay split by vocabulary for the cross-entropy; a tied table is
  one parameter split once (``parallel_tables.py``).

Every state_dict key of the block (``analyses/keys.py``) gets a placement; a
key no style can place (nGPT's s_qk with key/value heads replicated over more
ranks) is an error naming it (E0607), never a silent omission.

The plan also counts the collectives of one forward and of its backward per
layer with their payload, which the cost report turns into bytes on the wire.
The backward ones are the forward facts' duals: an all-gather's is a
reduce-scatter and a reduce-scatter's an all-gather; an all-reduce of a
pending sum sends nothing back; a branch input (or a vocab-parallel head's)
read by column-parallel projections gets its pending gradient reduced once —
all-reduced on a replicated stream, reduce-scatter onto a shard — while a
replicated consumer's (an extern, a replicated head) needs none. A norm of
feature-sharded rows sends what its family's ``sharded_backward`` says.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from blockir.analyses.collectives import GATHER, GATHER_BACKWARD, REDUCE, REDUCE_BACKWARD, Collective
from blockir.analyses.keys import decl_keys, fixup_biases, key_table
from blockir.analyses.parallel_linear import plan_linear
from blockir.analyses.parallel_moe import plan_moe
from blockir.analyses.parallel_placements import SUMMED, stacked
from blockir.analyses.parallel_tables import by_vocab, plan_embedding, plan_head
from blockir.analyses.linear_pairs import linear_pairs
from blockir.norms import FAMILIES, NormFamily, family
from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, error
from blockir.ir.decls import ExternDecl, InstanceDecl, KindDecl
from blockir.ir.kinds import layer_names
from blockir.ir.program import Block, Program
from blockir.ir.types import TensorType

LAYOUTS = ("replicated", "sequence", "hidden", "context")
# roles (ir/kinds.py LAYER_NAMES) of the column-parallel projections of each branch and of its row-parallel one
COLUMN = {"self_attention": ("q", "k", "v"), "cross_attention": ("q", "k", "v"), "mlp": ("fc1",),
          "gated_mlp": ("gate", "up")}
KV = ("k", "v")
ROW = {"self_attention": "o", "cross_attention": "o", "mlp": "fc2", "gated_mlp": "down"}
# kinds planned in a file of their own: kind → (planner, declaration, path, layer, sizes, block) → whether it placed
# the declaration (a lone linear outside the hidden layout is left to the defaults below)
KIND_PLANS = {"moe": plan_moe, "linear": plan_linear, "embedding": plan_embedding, "head": plan_head}
# where the stream lives, as a placement of a [B, S, D] tensor
STREAM = {"replicated": "replicate", "sequence": "shard(S)", "hidden": "shard(D)", "context": "shard(S)"}
# a parameter whose every rank applies it to its own rows: its gradient is a pending sum over the ranks
# a key norm's gain over key/value heads replicated over more ranks: each rank applies its head's block
SHARED_HEAD = "replicate (each rank applies its key/value head's slice; gradient summed over tp)"


@dataclass(frozen=True)
class ModuleStyle:
    """How one submodule is parallelised; ``path`` is its name in the compiled module."""

    path: str
    style: str  # colwise | columns | pair_columns | kv_replicated | rowwise | branch | head_norm | width_norm
    # | kv_width_norm | norm | replicate | extern | embedding | head | vocab_embedding | vocab_head | moe
    # | context_attention | context_moe | rows
    kind: str
    # a "columns" projection: how many equal blocks of its output features each rank stores its 1/P slice of
    # (1: a plain shard), or None where its rank's columns are no such pattern and it is stored whole
    blocks: int | None = None


@dataclass
class ParallelPlan:
    layout: str
    world: int
    per_token: bool = False  # batch or sequence size unknown: collective sizes count one token (one row)
    modules: list[ModuleStyle] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)  # state_dict key → placement
    collectives: dict[str, list[Collective]] = field(default_factory=dict)  # layer path → its forward collectives
    backward: dict[str, list[Collective]] = field(default_factory=dict)  # layer path → its backward collectives
    layers: list[str] = field(default_factory=list)  # module path of every stacked layer, in order
    vocab: bool = False  # token embeddings and heads split by vocabulary rows, logits left split
    # with vocab, the cross-entropy of the split logits under loss_parallel: the row maximum, the row sum of
    # exponentials and the target's logit, one all-reduce of B·S values each (its backward sends nothing)
    loss: list[Collective] = field(default_factory=list)
    # the context layout, load-balanced: rank r of P holds chunks r and 2P - 1 - r of 2P (zig-zag order)
    balanced: bool = False

    def styles(self) -> dict[str, str]:
        return {m.path: m.style for m in self.modules}


def _has_model_axis(program: Program, t: TensorType) -> bool:
    return any(program.dim_map[a].role.value == "model" for a in t.names)


def stream_type(program: Program, block: Block) -> TensorType:
    """The residual stream's type: the block's first input when it carries the model axis, else (a language
    model taking token ids) the input of the first block it instantiates that does, else its result."""
    if block.params and _has_model_axis(program, block.params[0].type):
        return block.params[0].type
    for d in block.decls:
        if isinstance(d, InstanceDecl):
            found = stream_type(program, program.block(d.block))
            if _has_model_axis(program, found):
                return found
    return block.params[0].type if block.params else block.result


def stream_ends(program: Program, block: Block) -> tuple[bool, bool]:
    """Whether the model takes the stream (a stream-typed first input) and whether it returns it: the module
    takes and returns full tensors, so under a split stream it slices the one and gathers the other."""
    names = stream_type(program, block).names
    return bool(block.params) and block.params[0].type.names == names, block.result.names == names


def _fail(span, message: str, hint: str | None = None) -> BlockError:
    return BlockError([error("E0730", message, span, hint=hint)])


def _stacked_blocks(d: KindDecl, fused: object, sizes: Sizes, world: int) -> int | None:
    """How many equal blocks of a fused matrix each rank holds a 1/world slice of, or None where its rank columns
    are no such pattern. Per head q, k, v in turn, a rank's heads are one contiguous block, and so are q/v/k
    row groups the degree divides (each rank's heads are whole groups); q, k and v stacked with as many
    key/value heads as query heads are 3 equal blocks, gate and up stacked 2. Stacked q, k, v with grouped
    key/value heads (blocks of different sizes) and q/v/k groups the degree cuts are read from a whole matrix."""
    if fused == "heads":
        return 1
    if fused == "qvk_groups":
        return 1 if int(sizes.value(d.arg("qkv_groups"))) % world == 0 else None
    if fused == "stacked":
        kv = d.arg("kv_heads")
        return 3 if kv is None or int(sizes.value(kv)) == int(sizes.value(d.arg("heads"))) else None
    return 2  # gate and up


def _divisible(d: KindDecl, what: str, n: int, world: int) -> None:
    if n % world:
        raise _fail(d.span, f"{d.kind} '{d.name}' has {n} {what}, which {world} ranks cannot split evenly",
                    f"choose a tensor-parallel degree that divides {n}")


def _kv_replicated(d: KindDecl, kv: int, world: int) -> bool:
    """Whether the key/value heads are replicated rather than split: more ranks than key/value heads.

    Each rank then holds whole query heads that all read one key/value head (vLLM and Megatron-LM
    replicate the key/value projection this way); that needs ``world`` to be a multiple of ``kv``."""
    if kv % world == 0:
        return False
    if world % kv:
        raise _fail(d.span, f"{d.kind} '{d.name}' has {kv} key/value heads, which {world} ranks can neither split "
                    "evenly nor share whole", f"choose a tensor-parallel degree that divides {kv} or is a multiple of it")
    return True


class _Planner:
    def __init__(self, program: Program, sizes: Sizes, layout: str, world: int, elements: int, stream_axis: str,
                 vocab: bool):
        self.program, self.sizes, self.layout, self.world, self.elements = program, sizes, layout, world, elements
        self.stream_axis = stream_axis  # the stream's model axis: elements over its size are the rows
        self.plan = ParallelPlan(layout, world, vocab=vocab)
        self._pairs: dict[str, dict[str, str]] = {}  # block name → its linear pairs

    def block(self, block: Block, prefix: str, layer: str) -> None:
        sizes = self.sizes.for_block(block)
        for d in block.decls:
            path = prefix + d.name
            if isinstance(d, InstanceDecl):
                sub = self.program.block(d.block)
                if d.count is None:
                    self.block(sub, path + ".", layer)
                else:
                    for i in range(sizes.count(d.count, f"stack '{d.name}'", d.span)):
                        self.plan.layers.append(f"{path}.{i}")
                        self.block(sub, f"{path}.{i}.", f"{path}.{i}")
            elif isinstance(d, ExternDecl):
                self.plan.modules.append(ModuleStyle(path, "extern", "extern"))
                self._gathered(layer, path)
            else:
                self.decl(d, path, layer, sizes, block)

    def _gathered(self, layer: str, path: str, partial: bool = False, elements: int | None = None) -> None:
        """Full rows for ``path``'s input; with ``partial`` its input gradient is a pending sum (column-parallel
        readers), reduced once in backward, else whole on every rank, sliced without a collective. ``elements``:
        the input's size where it is not the stream's (a head after OPT's narrower projection)."""
        elements = self.elements if elements is None else elements
        gather = GATHER[self.layout]
        if gather:
            self._collective(layer, Collective(path, gather, elements))
        if partial:
            self._backward(layer, Collective(path, GATHER_BACKWARD[self.layout], elements))

    def ends(self, takes: bool, returns: bool) -> None:
        """The model's own boundary (site ``""``) under a split stream: a stream it takes is sliced, its
        gradient gathered in backward; a stream it returns is gathered, its gradient sliced."""
        if GATHER[self.layout] is None:
            return
        if takes:
            self._backward("", Collective("", "all-gather", self.elements))
        if returns:
            self._collective("", Collective("", GATHER[self.layout], self.elements))

    def _reduced(self, layer: str, path: str, elements: int | None = None) -> None:
        """A pending sum of the stream's size (or of ``elements``) brought to the stream's layout, and its
        backward."""
        elements = self.elements if elements is None else elements
        self._collective(layer, Collective(path, REDUCE[self.layout], elements))
        back = REDUCE_BACKWARD[self.layout]
        if back:
            self._backward(layer, Collective(path, back, elements))

    def _collective(self, layer: str, c: Collective) -> None:
        self.plan.collectives.setdefault(layer, []).append(c)

    def _backward(self, layer: str, c: Collective) -> None:
        self.plan.backward.setdefault(layer, []).append(c)

    def _sharded_norm(self, layer: str, path: str, norm: NormFamily, decl: Any, rows: int, width: int,
                      gathered: int) -> None:
        """The collectives of a norm of ``rows`` rows of ``width`` features split over ranks (``norm`` its
        family, ``decl`` its declaration): the forward's one all-reduce of the row's partial sums, and the
        backward its family's sharded path sends, with an all-gather of the gradient's slices for each of the
        ``gathered`` affine parameters that are replicated (one stored split with the features needs none)."""
        self._collective(layer, Collective(path, "all-reduce", norm.reductions[0] * rows))
        if norm.sharded_backward(decl) == "row_sums":
            self._backward(layer, Collective(path, "all-reduce", norm.reductions[1] * rows))
            for _ in range(gathered):
                self._backward(layer, Collective(path, "all-gather", width))
        else:
            self._backward(layer, Collective(path, "reduce-scatter", rows * width))

    def pairs(self, block: Block) -> dict[str, str]:
        """``block``'s linears written out as an MLP (``linear_pairs.py``), found once per block."""
        if block.name not in self._pairs:
            self._pairs[block.name] = linear_pairs(block, self.stream_axis)
        return self._pairs[block.name]

    def divisible(self, d: KindDecl, what: str, n: int) -> None:
        _divisible(d, what, n, self.world)

    def _param(self, path: str, placement: str) -> None:
        self.plan.params[path] = placement

    def styled(self, path: str, style: str, kind: str) -> None:
        self.plan.modules.append(ModuleStyle(path, style, kind))

    def decl(self, d: KindDecl, path: str, layer: str, sizes: Sizes, block: Block) -> None:
        if d.category == "norm":
            self.plan.modules.append(ModuleStyle(path, "norm", d.kind))
            grads = {"sequence": SUMMED, "context": SUMMED}
            for name in _norm_params(d):
                self._param(f"{path}.{name}", grads.get(self.layout, "replicate"))
            for name, _ in family(d).buffers(d, ()):
                self._param(f"{path}.{name}", "replicate")
            if self.layout == "hidden":
                # one all-reduce carries the row's partial sums, one per reduction the norm takes (Σx², or Σx and Σx²);
                # its rows are the stream's, over a width a projection may make narrower (ELECTRA's embeddings)
                rows = self.elements // sizes.dim(self.stream_axis)
                self._sharded_norm(layer, path, family(d), d, rows, sizes.dim(d.arg("axes")[-1]), len(_norm_params(d)))
            return
        if d.kind in KIND_PLANS and KIND_PLANS[d.kind](self, d, path, layer, sizes, block):
            return
        if d.kind in COLUMN and self.layout == "context":
            self.context_branch(d, path, layer, sizes, block)
            return
        if d.kind in COLUMN:
            self.branch(d, path, layer, sizes)
            return
        self.plan.modules.append(ModuleStyle(path, "replicate", d.kind))
        if d.kind == "linear":
            self._param(f"{path}.weight", "replicate")
            if d.arg("bias"):
                self._param(f"{path}.bias", "replicate")
        elif d.category in ("scale", "shift"):
            self._param(path, SUMMED if self.layout == "context" else "replicate")
        if d.kind == "linear" and self.layout == "context":  # applied to each rank's rows of the stream
            for key in decl_keys(block, d, sizes):
                self._param(f"{path}.{key}", SUMMED)

    def context_branch(self, d: KindDecl, path: str, layer: str, sizes: Sizes, block: Block) -> None:
        """Context parallelism: every rank holds the branch's weights whole and runs it on its own rows, so
        each weight's gradient is a pending sum over the ranks. An MLP reads each row alone and sends nothing;
        a self-attention's queries need every key: its keys and values are all-gathered along the sequence
        (B·S·kv_heads·head_dim elements each) and the gradients reaching them reduce-scattered back."""
        self.plan.modules.append(ModuleStyle(path, "context_attention" if d.kind == "self_attention" else "rows",
                                             d.kind))
        for key in decl_keys(block, d, sizes):
            self._param(f"{path}.{key}", SUMMED)
        if d.kind == "cross_attention" or d.arg("score_residual") is not None:
            what = "attends to another sequence's keys" if d.kind == "cross_attention" else \
                "carries its [B, H, S, S] scores to the next layer (score_residual)"
            raise BlockError([error(
                "E0631", f"{d.kind} '{d.name}' {what}, which the context layout does not split by the stream's rows",
                d.span, hint="parallelise this block with the sequence layout (the branch then sees full rows)")])
        if d.kind != "self_attention":
            return
        heads = int(sizes.value(d.arg("heads")))
        kv = heads if d.arg("kv_heads") is None or d.arg("kv_broadcast") or d.arg("fused") == "qvk_groups" else \
            int(sizes.value(d.arg("kv_heads")))
        hd = int(sizes.value(d.arg("head_dim"))) if d.arg("head_dim") is not None else \
            sizes.dim(self.stream_axis) // heads
        keys = self.elements // sizes.dim(self.stream_axis) * kv * hd
        for _ in ("k", "v"):
            self._collective(layer, Collective(path, "all-gather", keys))
            self._backward(layer, Collective(path, "reduce-scatter", keys))

    def branch(self, d: KindDecl, path: str, layer: str, sizes: Sizes) -> None:
        """A built-in branch: its inner projections split by output columns, its outer one by input rows.

        GPT-2's transposed Conv1D weights split along their other axis; a fused matrix is split by its head
        groups (q, k, v stacked, per head in turn or in CodeGen's q/v/k row groups; gate and up stacked), each
        rank computing the columns of its own heads or units."""
        names = layer_names(d.kind, dict(d.args))
        attention = d.kind.endswith("attention")
        shared_kv = False
        if attention:
            heads = int(sizes.value(d.arg("heads")))
            kv = d.arg("kv_heads")
            _divisible(d, "heads", heads, self.world)
            shared_kv = _kv_replicated(d, int(sizes.value(kv)) if kv is not None else heads, self.world)
        else:
            _divisible(d, "hidden units", sizes.dim(d.arg("hidden")), self.world)
        self.plan.modules.append(ModuleStyle(path, "branch", d.kind))
        fused, conv1d, bias = d.arg("fused"), bool(d.arg("conv1d")), d.arg("bias")
        if fused in (None, False, "none"):
            for role in COLUMN[d.kind]:
                self._columns(f"{path}.{names[role]}", shared_kv and role in KV, conv1d, bias)
        else:
            sub = f"{path}.{names['qkv' if attention else 'gate_up']}"
            blocks = _stacked_blocks(d, fused, sizes, self.world)
            self.plan.modules.append(ModuleStyle(sub, "columns", "linear", blocks))
            self._param(f"{sub}.weight", stacked(blocks, 1 if conv1d else 0))
            if bias:
                self._param(f"{sub}.bias", stacked(blocks, 0))
        row = f"{path}.{names[ROW[d.kind]]}"
        self.plan.modules.append(ModuleStyle(row, "rowwise", "linear"))
        self._param(f"{row}.weight", "shard(0)" if conv1d else "shard(1)")
        if d.arg("out_bias" if attention else "bias"):
            self._param(f"{row}.bias", "replicate")
        if attention:
            self.head_params(d, path, names, shared_kv, layer, sizes)
        for key in fixup_biases(d):  # one scalar each rank adds to its own heads or units: a pending-sum gradient
            self._param(f"{path}.{key}", "replicate (gradient summed over tp)")
        self._gathered(layer, path, partial=True)
        self._reduced(layer, row)

    def _columns(self, sub: str, shared: bool, conv1d: bool, bias: bool) -> None:
        """One column-parallel projection of a branch (an nn.Linear, or GPT-2's transposed Conv1D)."""
        if shared:
            self.plan.modules.append(ModuleStyle(sub, "kv_replicated", "linear"))
            weight = bias_at = "replicate (each rank computes the key/value head of its query heads)"
        else:
            self.plan.modules.append(ModuleStyle(sub, "columns", "linear", 1) if conv1d else
                                     ModuleStyle(sub, "colwise", "linear"))
            weight, bias_at = ("shard(1)" if conv1d else "shard(0)"), "shard(0)"
        self._param(f"{sub}.weight", weight)
        if bias:
            self._param(f"{sub}.bias", bias_at)

    def head_params(self, d: KindDecl, path: str, names: dict[str, str], shared_kv: bool, layer: str,
                    sizes: Sizes) -> None:
        """Per-head parameters of an attention branch. A q/k norm over each head's features is one gain all
        heads share: every rank applies it to its own heads, so its gradient is a pending sum over tp. A norm
        over the whole width (OLMo-2) is split with the heads: each rank's gain is that of its own features,
        and the row moments come from one all-reduce of the ranks' partial sums, as a feature-sharded norm's
        do. With key/value heads replicated over more ranks, each rank's key features are its head's, and
        the ranks' slices together are the key row with each head repeated once per rank sharing it: the
        all-reduced partial sums over that row, divided by its width, are the key row's moments, and the key
        norm's gain stays replicated, each rank applying its head's block (a pending-sum gradient, since a
        rank's key gradient comes from its own query heads only). nGPT's s_qk has one entry per query feature
        and splits with its heads; a key head takes its group's first query gain, which a rank computing a
        replicated key/value head need not hold, so then it is left unplaced."""
        qk = FAMILIES.get(d.arg("qk_norm"))
        heads = int(sizes.value(d.arg("heads")))
        kv = int(sizes.value(d.arg("kv_heads"))) if d.arg("kv_heads") is not None else heads
        hd = int(sizes.value(d.arg("head_dim"))) if d.arg("head_dim") is not None else \
            sizes.dim(self.stream_axis) // heads
        if qk is not None and qk.scale_kind == "per_channel" and d.arg("qk_norm_axis") in ("head", "width"):
            width = d.arg("qk_norm_axis") == "width"
            if width and shared_kv and qk.sharded_backward(qk.defaults()) != "row_sums":
                return  # only a family's own sharded path takes the key row's moments from replicated heads
            for role, count in (("q_norm", heads), ("k_norm", kv)):
                sub = f"{path}.{names[role]}"
                style, placement = ("kv_width_norm", SHARED_HEAD) if width and shared_kv and role == "k_norm" else \
                    ("width_norm", "shard(0)") if width else ("head_norm", SUMMED)
                self.plan.modules.append(ModuleStyle(sub, style, d.kind))
                for key, _ in qk.keys(qk.defaults(), ()):
                    self._param(f"{sub}.{key}", placement)
                if width:  # the row moments' partial sums; no gain slice is gathered (split, or a pending sum)
                    rows = self.elements // sizes.dim(self.stream_axis)
                    self._sharded_norm(layer, sub, qk, qk.defaults(), rows, count * hd, 0)
        if d.arg("qk_scale") and not shared_kv:
            self._param(f"{path}.qk_scale", "shard(0)")
        if d.arg("head_scale"):  # NormFormer's scale of each query head's output
            self._param(f"{path}.head_scale", "shard(0)")


def _norm_params(d: KindDecl) -> tuple[str, ...]:
    return tuple(name for name, _ in family(d).keys(d, ()))


def _check_placed(program: Program, block: Block, sizes: Sizes, plan: ParallelPlan) -> None:
    """Every state_dict key the block owns has a placement: a key the plan cannot place is an error, never
    a silent omission (extern keys are bound from Python, so the plan only gives their inputs full rows)."""
    table = key_table(program, block, sizes)
    missing = [k for k in table.keys if k.name not in plan.params]
    if missing:
        first = missing[0]
        owner = program.block(first.block).decl_map[first.decl]
        shown = ", ".join(f"'{k.name}'" for k in missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise BlockError([error(
            "E0607", f"the {plan.layout} tensor-parallel plan over {plan.world} ranks cannot place {shown}: "
            f"{owner.kind} '{owner.name}' has no sharding that keeps whole heads or units on each rank", owner.span,
            hint="with nGPT's qk_scale, use no more ranks than key/value heads; or run this block without tensor "
                 "parallelism")])


def _vocab_decls(program: Program, block: Block) -> list[KindDecl]:
    """The token embeddings and heads ``block`` holds, its callees' included."""
    found = []
    for d in block.decls:
        if isinstance(d, InstanceDecl):
            found += _vocab_decls(program, program.block(d.block))
        elif isinstance(d, KindDecl) and by_vocab(d, block):
            found.append(d)
    return found


def _context_rows(program: Program, block: Block, state: TensorType, known: dict, world: int) -> None:  # type: ignore[type-arg]
    """The context layout splits the stream's sequence axis into ``world`` equal slices of whole rows (twice
    as many, two per rank, when load-balanced)."""
    seq = next((a for a in state.names if program.dim_map[a].role.value == "seq"), None)
    if seq is None:
        raise BlockError([error(
            "E0630", f"{block.kind} '{block.name}' has no sequence axis in its stream {state} for the context "
                     "layout to split", block.span,
            hint="context parallelism splits a [B, S, D] stream by its seq-role axis; declare one "
                 "(dim S: seq), or use the replicated or hidden layout")])
    if known[seq] is not None and int(known[seq]) % world:
        raise BlockError([error(
            "E0630", f"the sequence axis {seq} = {known[seq]} of {block.kind} '{block.name}' does not split into "
                     f"{world} equal slices of rows", block.span,
            hint=f"choose a sequence length that is a multiple of {world} (pad it), or fewer ranks")])


def derive_plan(program: Program, block: Block, sizes: Sizes, layout: str, world: int,
                vocab: bool = False, balanced: bool = False) -> ParallelPlan:
    """The plan for ``block`` with its stream ``layout`` over ``world`` ranks; with ``vocab``, its token
    embeddings and heads split by vocabulary rows; with ``balanced`` (the context layout only), the
    sequence in 2·world chunks, two per rank (zig-zag).

    ``sizes`` must know the stream's batch and sequence sizes for the collective counts."""
    if layout not in LAYOUTS:
        raise _fail(block.span, f"unknown layout '{layout}'", "layouts: " + ", ".join(LAYOUTS))
    state = stream_type(program, block)
    known = {a: sizes.env.get(a) for a in state.names}
    per_token = any(known[a] is None for a in state.rows)
    elements = 1
    for a in state.names:
        elements *= 1 if a in state.rows and per_token else sizes.dim(a)
    if layout == "context":
        _context_rows(program, block, state, known, 2 * world if balanced else world)
    if layout == "sequence":
        seq = next((a for a in state.names if program.dim_map[a].role.value == "seq"), None)
        if seq is None or (known[seq] is not None and int(known[seq]) % world):
            raise _fail(block.span, f"the sequence axis of {state} does not split evenly over {world} ranks",
                        "choose a sequence length divisible by the tensor-parallel degree")
    if layout == "hidden" and sizes.dim(state.names[-1]) % world:
        raise _fail(block.span, f"the model axis of {state} does not split evenly over {world} ranks")
    if vocab and not _vocab_decls(program, block):
        raise BlockError([error(
            "E0609", f"{block.kind} '{block.name}' has no token embedding or head to split by vocabulary", block.span,
            hint="vocab-parallelism applies to a language model that takes token ids or returns logits; "
                 "parallelise this block without it")])
    planner = _Planner(program, sizes, layout, world, elements, state.names[-1], vocab)
    planner.plan.per_token, planner.plan.balanced = per_token, balanced
    planner.block(block, "", "")
    planner.ends(*stream_ends(program, block))
    _check_placed(program, block, sizes, planner.plan)
    return planner.plan
