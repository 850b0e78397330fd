"""The main job learns (slow, not in CI: `make test-slow`): `make demo` with
its defaults takes held-out success from at most 50 % to at least 90 %, in at most
10 minutes of wall time including the warm start."""

import pytest

from core import config
from localstack.launch.demo import run_local
from localstack.launch.demo_config import DemoConfig


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_demo_defaults_take_held_out_success_from_at_most_half_to_ninety_percent(tmp_path):
    s = run_local(config.build(DemoConfig, workdir=str(tmp_path / "demo")))
    held = s.held_out["sampled"]
    assert held["first"]["version"] == 0 and held["first"]["success"] <= 0.5, held
    assert held["last"]["success"] >= 0.9, held
    assert s.demo_wall_s <= 600, s.demo_wall_s
