"""Settings the rollout side refuses at start-up: the rollout job (`python -m pipelines.job`)
and the environments' --env_config, as every rollout worker (and the evaluator) makes them.
Each row is checked by tests/_refusals.py; docs/CONFIG_REFUSALS.md is generated from these tables."""

from __future__ import annotations

import pytest

from pipelines import job
from tests._refusals import CHOICE, ROLLOUT, ROLLOUT_BASE, Row, checks, env_row, outcome, row

R = ROLLOUT

TABLE: list[Row] = [
    # ---- the rollout job: python -m pipelines.job -------------------------------
    row(R, "--records_topic", (), "missing", "packed records would go nowhere",
        "--records_topic", "missing required flags: --records_topic", unset=("--records_topic",)),
    row(R, "--policy_root", (), "missing", "no policy to roll out", "--policy_root",
        "missing required flags: --policy_root", unset=("--policy_root",)),
    row(R, "--model_config", "--model_config=huge", CHOICE, "no such model size",
        "--model_config", "argument --model_config: invalid choice: 'huge'"),
    row(R, "--advantage_estimator", "--advantage_estimator=ppo", CHOICE, "no such advantage estimator",
        "--advantage_estimator", "argument --advantage_estimator: invalid choice: 'ppo'"),
    row(R, "--overlong", "--overlong=wrap", CHOICE, "no rule for trajectories longer than the largest bucket",
        "--overlong", "argument --overlong: invalid choice: 'wrap'"),
    row(R, "--rows", "--rows=0", "<= 0", "records of no rows", "rows", "rows must be >= 1"),
    row(R, "--buckets", "--buckets=256,128", "not strictly increasing", "the bucket choice would be wrong",
        "buckets", "buckets must be strictly increasing"),
    row(R, "--seq_len", "--seq_len=0", "<= 0 (without --buckets)", "a record row with no room for a token",
        "seq_len", "seq_len must be >= 1"),
    row(R, "--max_trajectory_len", "--max_trajectory_len=2000", "> the largest bucket",
        "episodes that would fit no record", "max_trajectory_len", "max_trajectory_len 2000 exceeds the largest"),
    row(R, "--engine_slots", "--engine_slots=0", "<= 0", "an engine that can decode no episode",
        "engine_slots", "engine_slots must be >= 1"),
    row(R, "--max_concurrent_groups", "--max_concurrent_groups=0", "<= 0", "a worker that runs no request",
        "max_concurrent_groups", "max_concurrent_groups must be >= 1"),
    row(R, "--request_shards", "--request_shards=0", "<= 0", "no keys to spread requests over",
        "request_shards", "request_shards must be >= 1"),
    row(R, "--max_new_tokens_per_turn", "--max_new_tokens_per_turn=0", "<= 0", "turns that generate nothing",
        "max_new_tokens_per_turn", "max_new_tokens_per_turn must be >= 1"),
    row(R, "--max_new_tokens_per_turn", "--max_new_tokens_per_turn=256", ">= the longest trajectory",
        "a turn that leaves no room for the prompt", "max_new_tokens_per_turn",
        "max_new_tokens_per_turn (256) must be below max_tokens (256)"),
    row(R, "--queued_groups", "--queued_groups=-1", "< 0", "a negative request buffer",
        "queued_groups", "queued_groups must be >= 0"),
    row(R, "--admit_poll_s", "--admit_poll_s=0", "not a positive finite number",
        "Beam's thread polling a full buffer without pause", "admit_poll_s",
        "admit_poll_s must be > 0"),
    row(R, "--commit_interval_s", "--commit_interval_s=0", "not a positive finite number",
        "a commit timer that fires without pause, or never", "commit_interval_s",
        "commit_interval_s must be > 0"),
    row(R, "--policy_poll_s", "--policy_poll_s=0", "not a positive finite number",
        "polling the policy store without pause", "policy_poll_s",
        "policy_poll_s must be > 0"),
    row(R, "--policy_wait_s", "--policy_wait_s=-1", "not a positive finite number",
        "requests run before any policy exists", "policy_wait_s",
        "policy_wait_s must be > 0"),
    row(R, "--telemetry_every_s", "--telemetry_every_s=inf", "not a positive finite number",
        "telemetry rows never (or always) written", "telemetry_every_s",
        "telemetry_every_s must be a finite number"),
    row(R, "--num_shards", "--num_shards=0", "<= 0", "no packing keys: nothing is ever packed",
        "num_shards", "num_shards must be >= 1"),
    row(R, "--window_s", "--window_s=0", "not a positive finite number", "packing windows of no length",
        "window_s", "window_s must be > 0"),
    row(R, "--max_wait_s", "--max_wait_s=nan", "not a positive finite number",
        "a flush timer that never fires: part-filled records wait forever", "max_wait_s",
        "max_wait_s must be a finite number"),
    row(R, "--step_timeout_s", "--step_timeout_s=0", "not a positive finite number",
        "every tool call would time out at once", "step_timeout_s",
        "step_timeout_s must be > 0"),
    row(R, "--dedup_window_s", "--dedup_window_s=0", "not a positive finite number",
        "ids forgotten at once: duplicates are packed again", "dedup_window_s",
        "dedup_window_s must be > 0"),
    row(R, "--allowed_lateness_s", "--allowed_lateness_s=-1", "< 0 or infinite",
        "a negative lateness, or per-key state kept forever", "allowed_lateness_s",
        "allowed_lateness_s must be >= 0"),
    row(R, "--window_s", "--window_s=1", "< --max_wait_s", "the window end always comes first: a dead max_wait_s",
        "window_s", "window_s (1.0) must be >= max_wait_s (2.0)"),
    row(R, "--rows", "--rows=1024", "a record over the Pub/Sub message cap",
        "records the topic cannot carry: the learner starves", "rows", "a 1024x1024 record (up to 16384 trajectories)"),
    row(R, "--rows", "--rows=65537", "rows x seq_len over the decoder's cell cap", "records no decoder accepts",
        "rows", "record shape 65537x1024 is over 16777216 cells"),
    # ---- the environments: --env_config, as the rollout workers and the evaluator make them
    env_row("calculator", {"max_turns": 0}, "< 1", "an episode that ends before the model acts",
            "max_turns", "CalculatorConfig.max_turns must be an int >= 1"),
    env_row("calculator", {"max_expression_chars": 0}, "< 1", "a tool that refuses every expression",
            "max_expression_chars", "CalculatorConfig.max_expression_chars must be an int >= 1"),
    env_row("calculator", {"max_ops_per_call": 0}, "< 1", "a tool that can compute nothing",
            "max_ops_per_call", "CalculatorConfig.max_ops_per_call must be an int >= 1"),
    env_row("calculator", {"max_turn": 4}, "an unknown key", "a misspelt setting would be silently ignored",
            "max_turn", "CalculatorConfig.__init__() got an unexpected keyword argument 'max_turn'"),
    env_row("calculator", {"tool_latency": 0.5}, "not a spec string", "no latency model",
            "tool_latency", "tool_latency must be a LatencyModel or spec string, got float"),
    env_row("calculator", {"tool_latency": "gamma:1"}, "an unknown kind", "no such latency distribution",
            "tool_latency", "bad latency spec 'gamma:1': kind must be one of"),
    env_row("calculator", {"tool_latency": "fixed"}, "the wrong number of parameters",
            "a distribution with missing parameters", "tool_latency",
            "bad latency spec 'fixed': expected 'fixed:SECONDS'"),
    env_row("calculator", {"tool_latency": "fixed:abc"}, "parameters not numbers", "no latency to sample",
            "tool_latency", "bad latency spec 'fixed:abc': parameters must be numbers"),
    env_row("calculator", {"tool_latency": "fixed:-1"}, "a parameter < 0", "a negative wait",
            "tool_latency", "LatencyModel.seconds must be a finite number >= 0"),
    env_row("calculator", {"tool_latency": "fixed:inf"}, "a parameter not finite", "a tool call that never returns",
            "tool_latency", "LatencyModel.seconds must be a finite number"),
    env_row("calculator", {"tool_latency": "uniform:2:1"}, "uniform low > high", "an empty interval",
            "tool_latency", "uniform latency needs low <= high"),
    env_row("calculator", {"tool_latency": "lognormal:0:1"}, "lognormal median <= 0",
            "log(0): no distribution", "tool_latency", "lognormal latency needs median > 0"),
    env_row("guess", {"low": 10, "high": 1}, "low > high", "an empty range to guess in",
            "low", "GuessConfig needs low <= high"),
    env_row("guess", {"max_turns": 0}, "< 1", "an episode that ends before the first guess",
            "max_turns", "GuessConfig.max_turns must be an int >= 1"),
    env_row("guess", {"high": 1.5}, "not an int", "a range of non-integers", "high", "GuessConfig.high must be an int"),
    env_row("guess", {"shaping": 1}, "not in [0, 1)", "a lost game could score as much as a win",
            "shaping", "GuessConfig.shaping must be a number in [0, 1)"),
    env_row("guess", {"reply_window": "yes"}, "not true or false", "a setting read as true whatever it says",
            "reply_window", "GuessConfig.reply_window must be true or false"),
    env_row("code", {"max_turns": 0}, "< 1", "an episode that ends before the model acts",
            "max_turns", "CodeConfig.max_turns must be an int >= 1"),
    env_row("code", {"max_code_chars": 1000000}, "4 bytes a char over the sandbox's file limits",
            "programs the sandbox cannot hold", "max_code_chars", "CodeConfig.max_code_chars is too large"),
    env_row("code", {"sandbox": 5}, "not an object", "no sandbox limits", "sandbox",
            "sandbox must be SandboxLimits or a dict"),
    env_row("code", {"sandbox": {"wall_seconds": 0}}, "not a positive finite number",
            "every program killed at once, or never", "wall_seconds",
            "SandboxLimits.wall_seconds must be a finite number > 0"),
    env_row("code", {"sandbox": {"memory_bytes": 1048576}}, "< 64 MiB", "the interpreter alone needs ~20 MiB",
            "memory_bytes", "SandboxLimits.memory_bytes must be an int >= 67108864 (64 MiB"),
    env_row("code", {"sandbox": {"cpu_seconds": 0}}, "< 1", "every program killed before it runs",
            "cpu_seconds", "SandboxLimits.cpu_seconds must be an int >= 1"),
]  # fmt: skip

test_refused_with_documented_message, test_message_names_the_field, test_refused_before_anything_starts = checks(TABLE)


def test_rollout_build_checks_like_the_stand_in():
    """The real build() refuses what _rollout's stand-in for it refuses, before the pipeline runs."""
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions([*ROLLOUT_BASE, "--num_shards=0"])
    pipeline = job.beam.Pipeline(options=options)  # never run: not entered as a context
    with pytest.raises(ValueError, match=r"^num_shards must be >= 1"):
        job.build(pipeline, options)
    stand_in = next(r for r in TABLE if r.process == ROLLOUT and r.argv == ("--num_shards=0",))
    assert outcome(stand_in).message.startswith("num_shards must be >= 1")
