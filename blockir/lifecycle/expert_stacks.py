"""Per-expert matrices of a checkpoint → the stacked expert tensors a ``moe`` branch holds.

Released MoE checkpoints, and the folders transformers 5 itself saves, store each expert's
matrices apart (Mixtral's ``experts.3.w1.weight``, Qwen's ``experts.3.gate_proj.weight``);
transformers stacks them on load, as this module does: the gate matrices of all experts, then
their up matrices, become ``gate_up_proj`` [E, 2H, D] (each expert's gate rows first), and the down
matrices ``down_proj`` [E, D, H].
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from blockir.lifecycle.hf_folder import fail

EXPERT = re.compile(r"^(?P<owner>.+\.experts)\.(?P<index>\d+)\.(?P<name>w1|w2|w3|gate_proj|up_proj|down_proj)"
                    r"\.weight$")
# a stored matrix's name -> the stacked tensor it joins and its part there (0: gate or down, 1: up)
STACKED = {"w1": ("gate_up_proj", 0), "gate_proj": ("gate_up_proj", 0), "w3": ("gate_up_proj", 1),
           "up_proj": ("gate_up_proj", 1), "w2": ("down_proj", 0), "down_proj": ("down_proj", 0)}


def expert_slot(key: str) -> tuple[str, int, int] | None:
    """(the stacked key, expert, part) of a per-expert matrix's key; None for any other key."""
    m = EXPERT.match(key)
    if m is None:
        return None
    stacked, part = STACKED[m["name"]]
    return f"{m['owner']}.{stacked}", int(m["index"]), part


class Stacks:
    """Collects the per-expert matrices of each stacked key, then builds the stacked tensors."""

    def __init__(self) -> None:
        self.parts: dict[str, dict[tuple[int, int], tuple[torch.Tensor, str, Path]]] = {}

    def add(self, stacked: str, expert: int, part: int, tensor: torch.Tensor, stored: str, path: Path) -> None:
        self.parts.setdefault(stacked, {})[(part, expert)] = tensor, stored, path

    def build(self, stacked: str, meta: torch.Tensor) -> torch.Tensor | None:
        """The stacked tensor of ``stacked`` in ``meta``'s shape and dtype; None when no part was stored."""
        found = self.parts.get(stacked)
        if not found:
            return None
        experts, rows = meta.shape[0], meta.shape[1]
        parts = 2 if stacked.endswith("gate_up_proj") else 1
        want = (rows // parts, meta.shape[2])
        for (part, expert), (tensor, stored, path) in sorted(found.items()):
            if expert >= experts or tuple(tensor.shape) != want:
                raise fail("E0836", f"{path}: {stored}", f"{stored} has shape {list(tensor.shape)} in {path.name}, "
                           f"but the model built from config.json stacks {experts} experts of {list(want)}",
                           "the weights were saved from another configuration; pair them with their own config.json")
        missing = [(p, e) for p in range(parts) for e in range(experts) if (p, e) not in found]
        if missing:
            tensor, stored, path = next(iter(found.values()))
            raise fail("E0834", str(path.parent), f"the checkpoint stores {len(found)} of the {parts * experts} "
                       f"expert matrices of {stacked} (none for expert {missing[0][1]})",
                       "the checkpoint is incomplete, or config.json describes another model")
        blocks = [torch.stack([found[(p, e)][0] for e in range(experts)]) for p in range(parts)]
        return torch.cat(blocks, dim=1).to(dtype=meta.dtype)
