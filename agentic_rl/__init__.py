"""`agentic-rl`: the one command in front of every entry point (agentic_rl/cli.py)."""
