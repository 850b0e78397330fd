"""The policy both sides run: the model, its configs, the KV-cached sampler, the tokenizer."""
