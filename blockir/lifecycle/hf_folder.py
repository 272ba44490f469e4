"""Reading a transformers model folder: its config, its weight files, their tensors one file at a time.

A folder holds ``config.json`` and one of ``model.safetensors``, sharded safetensors listed by
``model.safetensors.index.json``, or ``pytorch_model.bin`` (sharded with
``pytorch_model.bin.index.json``), in transformers' order of preference. Every file name an index
gives must stay inside the folder. ``.bin`` files are read with ``weights_only=True`` (no code runs)
and memory-mapped where their format allows, so loading holds one shard's tensors at a time.
Every problem is a BlockError located at the file (and the JSON path inside it).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from blockir.diagnostics import BlockError, Span, error

if TYPE_CHECKING:  # reading a config needs no torch (`blockir import hf FOLDER`)
    import torch
    from torch import Tensor

CONFIG = "config.json"
GENERATION = "generation_config.json"
# transformers' order: safetensors before pickled weights, one file before an index
WEIGHTS = (("model.safetensors", None), ("model.safetensors.index.json", "safetensors"),
           ("pytorch_model.bin", None), ("pytorch_model.bin.index.json", "bin"))


# stored name prefix -> the model's, for families whose released checkpoints keep names transformers renames on
# load (and back on save)
RENAMES: dict[str, tuple[tuple[str, str], ...]] = {"gpt_neox": (("embed_out.", "lm_head."),)}
# a part of a stored name -> the model's, anywhere in the name
INFIX_RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "mixtral": ((".block_sparse_moe.", ".mlp."),),
    "granitemoe": ((".block_sparse_moe.input_linear.weight", ".block_sparse_moe.experts.gate_up_proj"),
                   (".block_sparse_moe.output_linear.weight", ".block_sparse_moe.experts.down_proj"),
                   (".block_sparse_moe.router.layer.weight", ".block_sparse_moe.router.weight"))}


def model_key(model_type: str, stored: str) -> str:
    """The model's name of a tensor stored under ``stored`` in a checkpoint of ``model_type``."""
    for old, new in INFIX_RENAMES.get(model_type, ()):
        stored = stored.replace(old, new)
    for old, new in RENAMES.get(model_type, ()):
        if stored.startswith(old):
            return new + stored[len(old):]
    return stored


def fail(code: str, where: str, message: str, hint: str | None = None, line: int = 0, column: int = 0) -> BlockError:
    return BlockError([error(code, message, Span(where, line, column), hint=hint)])


def _json(path: Path, code: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(code, str(path), f"cannot read {path.name}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(code, str(path), f"{path.name} is not JSON: {exc.msg}", line=exc.lineno, column=exc.colno) from None


def read_config(folder: Path) -> dict[str, Any]:
    """``config.json`` as a dict; a folder without one, or a file that is not a JSON object, is refused (E0830)."""
    if not folder.is_dir():
        raise fail("E0830", str(folder), f"{folder} is not a model folder (no such directory)",
                   "pass the directory save_pretrained wrote: config.json and the weights")
    path = folder / CONFIG
    if not path.is_file():
        raise fail("E0830", str(path), f"the folder has no {CONFIG}",
                   "a transformers model folder holds config.json beside its weights")
    config = _json(path, "E0830")
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise fail("E0830", f"{path}: model_type", f"{CONFIG} names no model_type",
                   "the config of a transformers model states its model_type")
    return config


def read_generation_config(folder: Path) -> dict[str, Any]:
    """``generation_config.json`` if the folder has one (its special token ids), else ``{}``."""
    path = folder / GENERATION
    if not path.is_file():
        return {}
    value = _json(path, "E0830")
    return value if isinstance(value, dict) else {}


def inside(folder: Path, name: Any, where: str) -> Path:
    """``folder / name`` for a file name read from a file of the folder; anything leading out is refused."""
    if not isinstance(name, str) or not name:
        raise fail("E0832", where, f"a weight file name must be a non-empty string, got {name!r}")
    path = (folder / name).resolve()
    if Path(name).is_absolute() or not path.is_relative_to(folder.resolve()):
        raise fail("E0832", where, f"weight file {name!r} lies outside the model folder",
                   "an index names shard files inside its own folder")
    return path


def weight_files(folder: Path) -> list[Path]:
    """The weight files to read, in order: the single file, or every shard an index lists (once each)."""
    for name, sharded in WEIGHTS:
        path = folder / name
        if not path.is_file():
            continue
        if sharded is None:
            return [path]
        index = _json(path, "E0832")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise fail("E0832", f"{path}: weight_map", f"{name} has no weight_map",
                       "an index maps every parameter name to the shard that holds it")
        shards: list[Path] = []
        for key, shard in weight_map.items():
            file = inside(folder, shard, f"{path}: weight_map.{key}")
            if not file.is_file():
                raise fail("E0832", f"{path}: weight_map.{key}", f"shard {shard!r} is missing from the folder",
                           "copy every shard the index lists into the folder")
            if file not in shards:
                shards.append(file)
        return shards
    raise fail("E0831", str(folder), "the folder has no weights: expected model.safetensors, "
               "model.safetensors.index.json, pytorch_model.bin or pytorch_model.bin.index.json",
               "save the model with save_pretrained into this folder")


def tensors(path: Path, device: torch.device | None) -> Iterator[tuple[str, Tensor]]:
    """The tensors of one weight file, read one by one (safetensors) or from one memory-mapped load."""
    import torch

    where = str(path)
    if path.suffix == ".safetensors":
        try:
            from safetensors import SafetensorError, safe_open
        except ImportError:
            raise fail("E0833", where, f"reading {path.name} needs the safetensors package",
                       "pip install 'blockir[hf]'") from None
        try:
            with safe_open(str(path), framework="pt", device=str(device or "cpu")) as f:
                for key in f.keys():
                    yield key, f.get_tensor(key)
        except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
            raise fail("E0833", where, f"cannot read {path.name} as safetensors: {exc}",
                       "the file is truncated or not a safetensors file; save the model again") from None
        return
    try:
        try:
            state = torch.load(path, map_location=device or "cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            state = torch.load(path, map_location=device or "cpu", weights_only=True)  # the legacy format
    except Exception as exc:  # noqa: BLE001 — torch.load raises many types for a damaged or hostile file
        raise fail("E0833", where, f"cannot read {path.name} as PyTorch weights: {str(exc).splitlines()[0]}",
                   "weights are read with weights_only=True: the file must hold tensors only") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise fail("E0833", where, f"{path.name} does not hold a state dict (names to tensors)")
    yield from state.items()
