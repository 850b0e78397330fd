"""The learner itself: train step, losses, staleness, batching, feeder, consumer, publishing, checkpoints."""
