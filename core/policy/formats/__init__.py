"""Checkpoints in and out: HF configs, key maps and safetensors weights, GGUF import and
export, and the HF export. A new family's key map and config reading, or a new file
format, go here."""
