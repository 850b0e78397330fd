"""The rollout side's Beam metrics live in one namespace (`rollout/...` in run reports)."""

NAMESPACE = "rollout"
