"""The contracts both sides share: packed record, rollout request, record shape, policy store, Pub/Sub I/O."""
