"""The Beam-free rollout runtime: the inference engine, the episode loop, the policy poller,
the per-process worker and the held-out evaluator. pipelines/ wraps it in a Beam graph."""
