"""nGPT's optimizer-side contract for compiled modules (Loshchilov et al., arXiv:2410.01131).

``project(module)`` normalizes every matrix of each block that declares
``l2norm(D, hypersphere=true)`` along its embedding axis; ``project_after_step(optimizer,
module)`` runs it after every optimizer step. See docs/ngpt.md.
"""
from blockir.lower.hypersphere import (
    parameter_norm_error,
    project,
    project_after_step,
)

__all__ = ["parameter_norm_error", "project", "project_after_step"]
