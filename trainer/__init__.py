"""Learner side and the parts both sides share.

policy/ and contracts/ (both sides), rl/ (shared RL math), learning/ (the learner),
cloud/ (Vertex AI), task.py (the entry point).
"""
