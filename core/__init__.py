"""Code both sides share: contracts/ (records, requests, trajectories, the policy store,
Pub/Sub I/O), policy/ (model and sampler), rl/ (RL math), telemetry/, config.py."""
