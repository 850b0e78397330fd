"""The settings several processes of a run must agree on, one section type each: which model
(`ModelChoice`), which environment (`EnvChoice`), how long a model turn may be (`TurnBudget`)
and where telemetry goes (`TelemetryDirs`);
the record layout is `core.contracts.record_shape.LayoutConfig`, LoRA `core.policy.model.lora.LoraConfig`.

Each process's config tree holds the sections it reads. A tree that holds several
processes (the demo) declares its own copy `section(..., shared=True)`: that one value is
given to every process's section of the type, which then has no flag of its own
(core/config.py). A flag is declared once, and reaches every process that reads it.
"""

from core.sections.env import EnvChoice
from core.sections.model import ModelChoice
from core.sections.telemetry import TelemetryDirs
from core.sections.turn import TurnBudget

__all__ = ["EnvChoice", "ModelChoice", "TelemetryDirs", "TurnBudget"]
