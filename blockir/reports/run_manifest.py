"""The training and runtime parts of the manifest, beside the architecture ``program_manifest`` describes.

``training``: the dropout RNG key scheme of every owner kind, the recompute
(activation checkpointing) policy and the optimizer state ``blockir run`` keeps.
``runtime``: the backend the manifest describes, what is deterministic, and the
parallel layout (single device, or the mesh axes whose placements
``parallel_layout`` lists). ``tensors``: device, stride and contiguity policy.
"""
from __future__ import annotations

from typing import Any

from blockir.analyses.hypersphere import on_sphere
from blockir.analyses.layouts import meshes
from blockir.lower import runtime_facts as facts
from blockir.ir.program import Program


def run_manifest(program: Program, backend: str = "fx") -> dict[str, Any]:
    """The ``training``, ``runtime`` and ``tensors`` sections for ``program`` compiled with ``backend``."""
    sphere = any(on_sphere(program, b.name) for b in program.blocks if b.kind == "model")
    optimizer = {k: v for k, v in facts.OPTIMIZER.items() if k != "weight_decay_on_sphere"}
    if sphere:  # nGPT trains without weight decay: the projection bounds every matrix
        optimizer["weight_decay"] = facts.OPTIMIZER["weight_decay_on_sphere"]
    axes = meshes(program)
    parallel = {"mesh": list(axes), "placements": "parallel_layout"} if axes else \
        {"mesh": [], "placements": "single device: every parameter and value whole on one device"}
    return {"training": {"dropout_rng": {"keyed": dict(facts.KEYED_DROPOUT),
                                         "attention_probabilities": facts.ATTENTION_DROPOUT},
                         "recompute": dict(facts.RECOMPUTE), "optimizer": optimizer},
            "runtime": {"backend": backend, "determinism": dict(facts.DETERMINISM), "parallel": parallel},
            "tensors": {k: v for k, v in facts.TENSORS.items() if backend == "fused" or k != "fused_boundaries"}}
