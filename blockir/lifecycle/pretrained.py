"""``blockir.from_pretrained``: a transformers model folder → its compiled model, weights loaded strictly.

The config goes through the importer (``blockir import hf``) to a program; the program is compiled
on the meta device, so no parameter memory is allocated, and each weight file's tensors then
replace the meta parameters one by one, cast to the model's dtype on the target device. Peak
memory is therefore about one copy of the weights plus one tensor. Tied parameters (a head that
reuses the token embedding) are one tensor, as in transformers: a checkpoint that stores the
shared table once loads, and one that stores both copies loads the embedding's.
"""
from __future__ import annotations

from os import PathLike
from pathlib import Path
from typing import Any

import torch
from torch import nn

from blockir.api import hf_block_text, parse, verify
from blockir.lower.layers.causal_lm import CausalLM
from blockir.lifecycle.expert_stacks import Stacks, expert_slot
from blockir.lifecycle.hf_folder import fail, model_key, read_config, read_generation_config, tensors, weight_files
from blockir.diagnostics import BlockError, argument_error
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block, Program

DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "half": torch.float16, "float64": torch.float64}


def _dtype(config: dict[str, Any], given: torch.dtype | None, where: str) -> torch.dtype:
    if given is not None:
        if given not in DTYPES.values():
            raise BlockError([argument_error("from_pretrained", "dtype", f"dtype must be a floating torch.dtype, "
                                             f"got {given!r}", "torch.float32, torch.bfloat16 or torch.float16")])
        return given
    name = config.get("dtype", config.get("torch_dtype"))
    if name is None or name == "auto":
        return torch.float32  # transformers' default for a config that states none
    name = name.removeprefix("torch.") if isinstance(name, str) else name
    if name not in DTYPES:
        key = "dtype" if "dtype" in config else "torch_dtype"
        raise fail("E0837", f"{where}: {key}", f"the config's {key} {name!r} is not a floating dtype blockir loads",
                   "one of " + ", ".join(DTYPES) + "; or pass dtype= to from_pretrained")
    return DTYPES[name]


def _is_causal_lm(program: Program, model: Block) -> bool:
    """Whether the importer's model is a causal LM: a head over causal attention (else an encoder)."""
    kinds = [d for b in program.blocks for d in b.decls if isinstance(d, KindDecl)]
    causal = all(d.arg("causal") for d in kinds if d.kind == "self_attention")
    return causal and any(d.kind == "head" for d in model.decls if isinstance(d, KindDecl))


def _slots(module: nn.Module) -> dict[str, tuple[nn.Module, str, torch.Tensor]]:
    """Every state key → (owning module, attribute, meta tensor); tied keys share one tensor."""
    out = {}
    for prefix, owner in module.named_modules(remove_duplicate=False):
        table = {**owner._parameters, **{k: v for k, v in owner._buffers.items()
                                         if k not in owner._non_persistent_buffers_set}}
        for name, value in table.items():
            if value is not None:
                out[f"{prefix}.{name}" if prefix else name] = (owner, name, value)
    return out


def load_weights(module: nn.Module, files: list[Path], device: torch.device | None, model_type: str = "") -> None:
    """Replace the meta tensors of ``module`` with the files' tensors; every key must match one (strict)."""
    slots = _slots(module)
    aliases: dict[int, list[str]] = {}
    for key, (_, _, value) in slots.items():
        aliases.setdefault(id(value), []).append(key)
    loaded: dict[int, torch.Tensor] = {}
    unexpected: list[tuple[str, Path]] = []
    stacks = Stacks()
    for path in files:
        for stored, tensor in tensors(path, device):
            key = model_key(model_type, stored)
            slot = slots.get(key)
            expert = expert_slot(key) if slot is None else None
            if expert is not None and expert[0] in slots:
                meta = slots[expert[0]][2]
                stacked = stacks.add(*expert, tensor.to(device=device or tensor.device), meta, stored, path)
                if stacked is not None:
                    loaded[id(meta)] = stacked
                continue
            if slot is None:
                unexpected.append((stored, path))
                continue
            owner, name, meta = slot
            if tuple(tensor.shape) != tuple(meta.shape):
                raise fail("E0836", f"{path}: {stored}", f"{stored} has shape {list(tensor.shape)} in {path.name}, but "
                           f"the model built from config.json expects {list(meta.shape)}",
                           "the weights were saved from another configuration; pair them with their own config.json")
            if id(meta) in loaded and aliases[id(meta)][0] != key:
                continue  # the second copy of a tied table: the first key's tensor is the one shared
            loaded[id(meta)] = tensor.to(device=device or tensor.device, dtype=meta.dtype)
    if unexpected:
        key, path = unexpected[0]
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise fail("E0835", f"{path}: {key}", f"{path.name} holds {key}{more}, which the model built from "
                   f"config.json does not have", "the weights belong to another architecture or class")
    stacks.check_complete({key: meta for key, (_, _, meta) in slots.items()})
    missing = [keys[0] for ident, keys in aliases.items() if ident not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise fail("E0834", str(files[0].parent), f"no weight file of the folder holds {missing[0]}{more}",
                   "the checkpoint is incomplete, or config.json describes another model")
    for key, (owner, name, meta) in slots.items():
        value = loaded[id(meta)]
        if isinstance(meta, nn.Parameter):
            if not isinstance(value, nn.Parameter):  # one Parameter per table, shared by its tied keys
                value = loaded[id(meta)] = nn.Parameter(value, requires_grad=meta.requires_grad)
            owner._parameters[name] = value
        else:
            owner._buffers[name] = value


def from_pretrained(folder: str | PathLike[str], exact: bool = False, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> CausalLM | nn.Module:
    """The model of a transformers folder, compiled by blockir, its weights loaded strictly: a causal LM as a
    ``CausalLM`` (HF's call and ``generate``), an encoder (its base model or masked LM) as the compiled module.

    ``exact`` writes HF's eager attention op for op (bit-exact against an eager HF model);
    ``dtype`` defaults to the config's ``dtype``/``torch_dtype`` (fp32 if it states none);
    ``device`` is where the weights are loaded to (default CPU).
    """
    from blockir.lower.compile import checked_device, compile

    if not isinstance(folder, (str, PathLike)):
        raise BlockError([argument_error("from_pretrained", "folder", f"folder must be a path, got "
                                         f"{type(folder).__name__}")])
    root = Path(folder)
    config = read_config(root)
    where = str(root / "config.json")
    place = checked_device(device)
    weights_dtype = _dtype(config, dtype, where)
    files = weight_files(root)
    text = hf_block_text(config, exact=exact)
    program = parse(text, f"<hf {config['model_type']}>")
    errors = [d for d in verify(program) if d.is_error]
    if errors:
        raise BlockError(errors, {f"<hf {config['model_type']}>": text})
    model = [b for b in program.blocks if b.kind == "model"][-1]
    name = model.name
    module = compile(program, name, dtype=weights_dtype, device="meta").eval()
    load_weights(module, files, place, config["model_type"])
    from blockir.lower.layers.modules import tie_heads
    tie_heads(module, model)
    if not _is_causal_lm(program, model):
        module.program = program
        return module
    lm = CausalLM(module, name, config, read_generation_config(root))
    lm.program = program
    return lm.eval()


def causal_lm(folder: str | PathLike[str], **options: Any) -> CausalLM:
    """A folder's causal LM, for the commands that decode or train next-token prediction; an encoder is E0842."""
    lm = from_pretrained(folder, **options)
    if not isinstance(lm, CausalLM):
        raise fail("E0842", f"{Path(folder) / 'config.json'}: model_type", f"{lm.blockir_block} is not a causal "
                   "language model (no LM head over causal attention): it neither generates nor trains on next "
                   "tokens", "blockir.from_pretrained(folder) loads it as a module, called as HF's encoder is")
    return lm


def pretrained_for_training(folder: str | PathLike[str]) -> CausalLM:
    """A folder's causal LM as ``blockir run`` trains it: fp32 master weights (whatever the config's dtype),
    a vocabulary that holds every byte (the run feeds bytes as token ids), in training mode."""
    from blockir.lifecycle.lm import VOCAB

    root = Path(folder)
    vocab = read_config(root).get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab < VOCAB:
        raise fail("E0844", f"{root / 'config.json'}: vocab_size", f"the model has a vocabulary of {vocab} tokens, "
                   f"and a run feeds it bytes as token ids, which needs at least {VOCAB}",
                   f"train a model whose vocab_size is {VOCAB} or more")
    return causal_lm(root, dtype=torch.float32).train()
