"""The policy: model families, tokenizers, chat formats, sampling, checkpoints in and out.

Every process that runs the model imports this package before JAX starts its backend, so
the CPU backend's flags are set here (core/xla_cpu.py: a memory-minimising scheduler)."""

from core import xla_cpu

xla_cpu.configure()
