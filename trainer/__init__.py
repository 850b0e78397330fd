"""The learner alone: learning/ (loop parts, data plane, losses, checkpoints, warm start),
cloud/ (Vertex AI), task.py (the entry point). Shared code is in core/."""
