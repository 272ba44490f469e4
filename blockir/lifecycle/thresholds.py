"""The canary's default triggers, recorded in a release manifest at release time so that a canary cannot pick
its thresholds afterwards (docs/lifecycle.md). A module of its own: the release command's help reads them
without importing the manifest machinery."""
from __future__ import annotations

DEFAULT_THRESHOLDS = {"max_logit_error": 1e-4, "max_loss_increase": 0.0, "max_latency_ratio": 2.0,
                      "max_memory_ratio": 1.1, "max_non_finite": 0}
