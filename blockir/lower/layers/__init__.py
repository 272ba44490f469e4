"""The torch modules a compiled block calls: branches, norms, masks, rotary embedding, KV cache, causal LM."""
