"""The network: the transformer and its config per family, attention kernels, rope, LoRA,
log-probs and its FLOPs. A new family whose blocks differ starts here."""
