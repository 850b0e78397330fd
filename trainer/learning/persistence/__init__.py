"""What outlives a step: policy versions published to the store, and the learner's Orbax
checkpoints, against which records are acked."""
