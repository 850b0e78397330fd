"""The learner: `data/` (requests out, records in, held until checkpointed), `step/` (the
train step and its losses), `persistence/` (policy versions and checkpoints); at the top,
the builder that wires them, the warm start, the capacity plan, run stats and telemetry."""
