"""The scale planner (localstack/launch/scale_plan.py, scale_model.py, accelerators.py):
its formulas, its invariants, and its prediction of this machine's measured duty cycle."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.policy.model.config import MODEL_CONFIGS
from localstack.launch import scale_model as sm
from localstack.launch import scale_plan
from localstack.launch.accelerators import CHIPS, parse_slice

ROOT = Path(__file__).resolve().parents[1]
UTILIZATION = ROOT / "docs/results/utilization.json"
QWEN05 = sm.ModelDims.from_config(scale_plan.model_config("qwen2.5-0.5b"))
A = sm.Assumptions()


# ------------------------------------------------------------------ this machine, measured
@pytest.mark.parametrize("latency", ["none", "fixed:0.5", "fixed:2", "lognormal:1:1"])
def test_predicts_this_machines_measured_duty_within_10_points(latency):
    """docs/results/utilization.json (benchmarks/utilization.py, docs/BENCHMARKS.md
    "Utilization"): the learner-alone step, the rollout-job-alone rate and packing, the
    plan's measured episode time, at each latency -> the async run's measured duty."""
    cfg = scale_plan.parse_config(
        ["--model", "tiny", "--measured", str(UTILIZATION), "--tool_latency", latency, "--workers", "1",
         "--group_size", "8", "--target_duty", "0.95", "--rows", "4", "--seq_len", "256", "--max_segments", "4"]
    )  # fmt: skip
    r = scale_plan.run(cfg)
    measured = json.loads(UTILIZATION.read_text())
    row = next(x for x in measured["latencies"] if x["tool_latency"] == latency)
    assert r["measured"]["measured_duty"] == row["async"]["duty"]
    assert abs(r["plan"]["duty"] - row["async"]["duty"]) <= 0.10
    assert r["plan"]["binds"] == "rollout workers (measured rate)"  # one core of rollouts binds here
    # The same arithmetic as the local planner that run used (its recorded prediction).
    assert r["plan"]["duty"] == pytest.approx(row["predicted"]["async"]["duty_cycle"], abs=0.02)


def test_predicts_the_issue_22_rerun_within_10_points():
    """docs/BENCHMARKS.md, "Re-run after issue 22" (2 s tools, 1x1024 records, 16 a record):
    learner alone 127 trajectories/s at a 0.432 s step, one rollout core 68.2/s, publish
    every 2, 4 records a step, staleness bound 2; measured async duty 0.229."""
    p = sm.plan(step_s=0.432, trajectories_per_record=127 * 0.432 / 4, batch_records=4, worker_rate=68.2,
                worker_binds="rollout", episode_s=3.52, pipeline_s=2.0, tokens_per_trajectory=65.5,
                target_duty=0.95, group_size=8, publish_every=2, min_window=4 * 16 + 8, staleness_bound=2.0,
                workers=1)  # fmt: skip
    assert p["max_in_flight"] == 216  # what that run's plan chose
    assert p["binds"] == "in-flight cap (staleness)"
    assert abs(p["duty"] - 0.229) <= 0.10


# ------------------------------------------------------------------ formulas
def test_parameter_count_matches_the_model(tmp_path):
    import jax

    from core.policy.model.transformer import init_model, split_params

    for cfg in (MODEL_CONFIGS["tiny"], scale_plan.model_config(str(_tiny_qwen_config(tmp_path)))):
        _, params = split_params(init_model(cfg, 0))
        assert sm.count_params(cfg) == sum(x.size for x in jax.tree.leaves(params))


def _tiny_qwen_config(tmp_path: Path) -> Path:
    d = dict(scale_plan.PRESETS["qwen2.5-0.5b"], hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=2, vocab_size=300, tie_word_embeddings=False)  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    return path


def test_real_sizes():
    assert QWEN05.params == pytest.approx(494e6, rel=0.01)  # docs/MODELS.md: 494 M
    assert QWEN05.kv_bytes_per_token == 24 * 2 * 64 * 2 * 2  # 12 KB in bf16 (docs/MODELS.md)
    q7 = sm.ModelDims.from_config(scale_plan.model_config("qwen2.5-7b"))
    assert q7.params == pytest.approx(7.62e9, rel=0.01)
    assert q7.flop_params == q7.params - 152064 * 3584  # the untied input embedding is a lookup


def test_learner_flops_match_xla_count_for_the_tiny_model():
    """docs/BENCHMARKS.md, Learner section 2: XLA's cost analysis of the step on records of
    4x256 (dense attention over the row): 1.33 / 2.65 / 5.29 / 10.6 GFLOP at 1 / 2 / 4 / 8."""
    dims = sm.ModelDims.from_config(MODEL_CONFIGS["tiny"])
    for records, xla in ((1, 1.33e9), (2, 2.65e9), (4, 5.29e9), (8, 10.6e9)):
        batch = sm.Batch(records, 4, 256, 4, 0.75, attention_span=256)
        assert sm.learner_step(dims, parse_slice("v5e-1"), batch, 1.0)["flops"] == pytest.approx(xla, rel=0.1)


def test_learner_step_formula():
    hw = parse_slice("v5e-8")
    batch = sm.Batch(16, 4, 2048, 2, 0.9, attention_span=2048)
    s = sm.learner_step(QWEN05, hw, batch, 0.5)
    per_slot = 6 * QWEN05.flop_params + 12 * 24 * 2048 * 896
    assert s["flops"] == pytest.approx(per_slot * batch.slots)
    assert s["step_s"] == pytest.approx(s["flops"] / (8 * 197e12 * 0.5))
    kl = sm.learner_step(QWEN05, hw, sm.Batch(16, 4, 2048, 2, 0.9, 2048, kl_reference=True), 0.5)
    assert kl["flops_reference"] == pytest.approx((2 * QWEN05.flop_params + 4 * 24 * 2048 * 896) * batch.slots)
    assert kl["step_s"] > s["step_s"]


def test_decode_is_bandwidth_bound_and_fits_hbm():
    ep = sm.Episode(1536, 384, 3, 2.0)
    w = sm.rollout_worker(QWEN05, parse_slice("l4"), ep, sm.Engine(128, 16, 8, 2048), A)
    read = QWEN05.flop_params * 2 + 128 * 2048 * QWEN05.kv_bytes_per_token
    assert w.decode_step_s == pytest.approx(read / (300e9 * A.bandwidth_efficiency) + A.step_overhead_s)
    assert w.max_slots == int((24e9 * 0.9 - QWEN05.params * 2) // (2048 * QWEN05.kv_bytes_per_token))
    assert w.binds == "decode bandwidth"
    big = sm.ModelDims.from_config(scale_plan.model_config("qwen2.5-7b"))
    with pytest.raises(ValueError, match="do not fit"):
        sm.rollout_worker(big, parse_slice("l4"), ep, sm.Engine(128, 16, 8, 131072), A)


def test_slices_and_cloud_settings():
    assert parse_slice("v5e-8").vertex() == {
        "machine_type": "ct5lp-hightpu-8t",
        "tpu_topology": "2x4",
        "replica_count": 1,
    }
    v5p = parse_slice("v5p-64")  # 64 TensorCores: 32 chips on 8 hosts of 4
    assert (v5p.chips, v5p.hosts) == (32, 8)
    assert v5p.vertex() == {"machine_type": "ct5p-hightpu-4t", "tpu_topology": "2x4x4", "replica_count": 8}
    assert parse_slice("l4").dataflow()["machine_type"] == "g2-standard-8"
    assert "count:2" in parse_slice("l4x2").dataflow()["dataflow_service_options"]
    assert parse_slice("v6e-16").flops == 16 * 918e12
    for bad in ("v5e-6x", "tpu", "v5p-7", "v5e-12"):
        with pytest.raises(ValueError):
            parse_slice(bad)
    assert all(c.source.startswith("https://") for c in CHIPS.values())


def test_latency_means():
    assert scale_plan.latency_mean("fixed:2") == 2
    assert scale_plan.latency_mean("uniform:1:3") == 2
    assert scale_plan.latency_mean("lognormal:1:1") == pytest.approx(math.exp(0.5))


def test_cli_prints_a_table(capsys):
    assert scale_plan.main(["--model", "qwen2.5-0.5b", "--accelerator", "v5e-8", "--rollout_accelerator", "l4",
                            "--tool_latency_s", "2", "--batch_records", "16", "--max_segments", "2"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    for needle in ("learner step", "MFU 0.4", "binds", "--tpu_topology=2x4", "--max_num_workers=", "nvidia-l4"):
        assert needle in out


# ------------------------------------------------------------------ invariants
_PLAN = dict(step_s=0.8, trajectories_per_record=5.0, batch_records=16, pipeline_s=2.0, tokens_per_trajectory=1500,
             target_duty=0.9, group_size=8, publish_every=5, min_window=72, worker_binds="w")  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), rate=st.floats(0.2, 30), episode=st.floats(0.5, 120), bound=st.floats(0.5, 8))
def test_more_workers_never_lower_duty(n, rate, episode, bound):
    kw = dict(_PLAN, worker_rate=rate, episode_s=episode, staleness_bound=bound)
    assert sm.plan(**kw, workers=n + 1)["duty"] >= sm.plan(**kw, workers=n)["duty"] - 1e-12


@settings(max_examples=60, deadline=None)
@given(lat=st.floats(0, 30), more=st.floats(0.01, 30), calls=st.floats(0.5, 6), slots=st.integers(8, 512))
def test_higher_latency_never_lowers_required_in_flight(lat, more, calls, slots):
    """At the target rate (the pool sized to it), Little: more latency, more in flight.
    (With the pool capped, slower slot-bound workers make fewer, so fewer are in the pipeline.)"""

    def required(latency):
        w = sm.rollout_worker(QWEN05, parse_slice("l4"), sm.Episode(1536, 384, calls, latency),
                              sm.Engine(slots, 16, 8, 2048), A)  # fmt: skip
        kw = dict(_PLAN, worker_rate=w.rate, episode_s=w.episode_s, staleness_bound=2.0, max_workers=None)
        return sm.plan(**kw)["required_in_flight"]

    assert required(lat + more) >= required(lat)


@settings(max_examples=40, deadline=None)
@given(bw=st.floats(0.1, 1), slots=st.integers(1, 256), lat=st.floats(0, 20))
def test_worker_rate_rises_with_bandwidth_and_falls_with_latency(bw, slots, lat):
    ep, eng = sm.Episode(1536, 384, 3, lat), sm.Engine(slots, 16, 8, 2048)
    slow = sm.rollout_worker(QWEN05, parse_slice("l4"), ep, eng, sm.Assumptions(bandwidth_efficiency=bw / 2))
    fast = sm.rollout_worker(QWEN05, parse_slice("l4"), ep, eng, sm.Assumptions(bandwidth_efficiency=bw))
    assert fast.rate >= slow.rate - 1e-12
    later = sm.rollout_worker(QWEN05, parse_slice("l4"), sm.Episode(1536, 384, 3, lat + 1), eng, A)
    assert later.rate <= sm.rollout_worker(QWEN05, parse_slice("l4"), ep, eng, A).rate + 1e-12


@settings(max_examples=40, deadline=None)
@given(duty=st.floats(0.1, 1), pe=st.integers(1, 20), bound=st.floats(0.5, 8), episode=st.floats(0.5, 120))
def test_staleness_is_window_over_versions_and_bounded_above_the_floor(duty, pe, bound, episode):
    kw = dict(_PLAN, worker_rate=1000.0, episode_s=episode, staleness_bound=bound, publish_every=pe, target_duty=duty)
    p = sm.plan(**kw)
    assert p["staleness_versions"] == pytest.approx(p["max_in_flight"] / (pe * p["trajectories_per_step"]))
    floor = math.ceil(_PLAN["min_window"] / 8) * 8
    if p["max_in_flight"] > floor:  # above the deadlock floor the bound holds (one group of rounding)
        assert p["staleness_versions"] <= bound + 8 / (pe * p["trajectories_per_step"]) + 1e-9
