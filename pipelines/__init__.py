"""Rollout side: a streaming Beam pipeline that runs episodes and publishes packed records."""
