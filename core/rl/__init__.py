"""RL math both sides share: group-relative advantages."""
