"""Drawing tokens: the sampler (prefill and KV cache), the device decode loop, the draw at a
temperature, and `generate` for a version."""
