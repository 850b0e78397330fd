"""Every recipe learns (slow, not in CI: `make test-slow`): `make demo ARGS="--env
ENV"` with the recipe's defaults takes held-out success (sampled, the environment's own
criterion) from at most 0.6 at v0 to at least v0 + 0.20 at its last version, in at most
15 minutes of wall time including the warm start (docs/RESULTS.md, "Every recipe")."""

import pytest

from localstack.launch.demo import run_local
from localstack.launch.demo_config import parse_args


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("env", ["code", "guess"])
def test_the_recipe_raises_held_out_success_by_a_fifth(env, tmp_path):
    s = run_local(parse_args(["--env", env, "--workdir", str(tmp_path / env), "--live", "off"]))
    held = s.held_out["sampled"]
    first, last = held["first"], held["last"]
    assert first["version"] == 0 and first["success"] <= 0.6, held
    assert last["success"] >= first["success"] + 0.2, held
    assert s.demo_wall_s <= 900, s.demo_wall_s
