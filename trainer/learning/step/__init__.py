"""The train step: the Learner (params, optimizer, one compiled step), its losses, the
gradients (micro-batches, remat), sharding over a mesh, memory checks, the learning-rate
schedule and the lockstep of a multi-process learner."""
