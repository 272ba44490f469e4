"""What the compiled module and the trainer of ``blockir run`` do at run time, stated without importing torch.

The manifest reports these beside the architecture; tests/test_manifest_fields.py checks each against
the objects the backends build, so a change to the backends that makes one untrue fails there.
"""
from __future__ import annotations

from typing import Any

# dropout written in the graph (dropout, drop_path, layer_drop): blockir/lower/rng.py, fx.dropout_site
KEYED_DROPOUT: dict[str, Any] = {
    "key": ["seed", "layer", "site", "row", "column"],
    "seed": "one draw from torch's generator per training forward of each block that drops (each layer its own)",
    "layer": "the index of the block's own layer in the stack that instantiates it (0 for a block no stack "
             "instantiates)",
    "site": "CRC-32 of the name of the value the dropout writes",
    "layer_drop": "keyed by seed and layer only: one draw per layer",
    "hash": "MurmurHash3 fmix32; keep an element when the top 24 bits reach the threshold of p",
    "replay": "the same seed replays the same masks (a recomputed forward, the fused kernels)",
}
# an attention declaration's dropout=: the attention kernel's own draw (blockir/lower/layers/attention_core.py)
ATTENTION_DROPOUT = "torch's generator, drawn inside the attention kernel (not keyed: a replay needs its RNG state)"

# neither blockir.compile nor blockir run checkpoints activations: backward reads what the forward saved
RECOMPUTE = {"activation_checkpointing": False,
             "saved": "every tensor autograd saves is kept from the forward to the backward"}

# blockir run's trainer (blockir/lifecycle/session.py)
OPTIMIZER: dict[str, Any] = {"name": "AdamW", "state": ["step", "exp_avg", "exp_avg_sq"],
                             "weight_decay": 0.01, "weight_decay_on_sphere": 0.0,
                             "schedule": "linear warmup to the learning rate, constant afterwards"}

# where tensors live and how they are laid out
TENSORS = {"parameters": "on the device given to compile (device=…), the declared dtype or the activation dtype",
           "values": "as the torch ops return them; a value is made contiguous only where a kernel needs it",
           "fused_boundaries": "the fused add+norm kernels read and write contiguous rows [rows, D]"}

DETERMINISM = {"evaluation": "no random draw: dropout is the identity",
               "training": "keyed dropout masks are a function of the seed drawn each forward; attention-"
                           "probability dropout depends on torch's generator state"}
