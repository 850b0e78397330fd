"""How many tokens one model turn may generate: the rollout workers' engine, the held-out
evaluator and the demo's record layout must agree (a layout sized for 32-token turns cuts
a 48-token call)."""

from __future__ import annotations

from core.config import configclass, knob


@configclass
class TurnBudget:
    """The per-turn generation cap. The environment's recipe sets it (code's actions are
    longer than the calculator's); an episode's whole length is the layout's."""

    max_new_tokens_per_turn: int = knob(32, "tokens one model turn may generate", ge=1)
