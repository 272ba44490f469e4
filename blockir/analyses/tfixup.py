"""T-Fixup's initialisation scales (Huang et al., "Improving Transformer Optimization Through Better
Initialization", ICML 2020), read by the recipe that writes them and the verifier that checks a block
stating ``tfixup = 1``."""
from __future__ import annotations

SIDES = ("encoder", "decoder")


def gains(n: int) -> dict[str, float]:
    """The scales for N layers: decoder V/O, MLP and embeddings ``(9N)^(-1/4)``; encoder V/O and MLP
    ``0.67 N^(-1/4)``."""
    return {"decoder": (9 * n) ** -0.25, "encoder": 0.67 * n ** -0.25}
