"""Every setting a user can pass that a process refuses at start-up, in one table.

Each row is passed the way a user passes it (the process's own argument parser and the
entry function it runs at start: `trainer.task.run`, `pipelines.rollout.run`,
`rollout.evaluator.run`, `localstack.launch.demo.run_local`, `trainer.cloud.vertex.main`;
`environments.make` for --env_config, as every rollout worker and the evaluator call it),
with whatever would start something (a model, a warm start, a policy publish, the feeder,
a heartbeat, a pipeline, a watchdog, a job) replaced by a recorder. Three checks a row:
  * refused: ValueError or SystemExit, with the message the table documents;
  * the message names the flag or field (`field`);
  * nothing had started when it was refused.
A row that fails one of them today carries the defect (`not_named`, `wrong_type`,
`late`) and that check is a strict xfail: fixing the code turns it into an XPASS, and
the row's mark goes.

The table is also docs/CONFIG_REFUSALS.md: `python -m tests.test_config_refusals --write`
rewrites it, and `test_doc_matches_table` fails while the two differ.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import logging
import os
import re
import sys
import tempfile
import threading
import types
from pathlib import Path
from unittest import mock

import pytest

import environments
from core.telemetry import trace
from localstack.launch import demo, processes
from pipelines import rollout
from pipelines.options import RolloutOptions, engine_config, packing_config
from rollout import evaluator
from trainer import task
from trainer.cloud import vertex
from trainer.learning import builder

DOC = Path(__file__).resolve().parent.parent / "docs" / "CONFIG_REFUSALS.md"

LEARNER, ROLLOUT, EVALUATOR = "trainer.task", "pipelines.rollout", "rollout.evaluator"
DEMO, VERTEX, ENVIRONMENT = "localstack.launch.demo", "trainer.cloud.vertex", "environments.make"

# Where a refusal comes too late: "refused only ..." (the xfail reason, and the doc's note).
AFTER_MODEL = "after the learner has built its model"


@dataclasses.dataclass(frozen=True)
class Row:
    process: str
    flag: str  # as the doc shows it
    argv: tuple[str, ...]  # added to the process's base flags (for the environment: --env, --env_config)
    when: str  # refused when
    why: str  # the deadlock or nonsense it prevents
    field: str  # the flag or field the message must name
    starts: str  # the message starts with
    unset: tuple[str, ...] = ()  # base flags taken away
    not_named: bool = False  # the message does not name the field
    wrong_type: str | None = None  # refused with this, not ValueError / SystemExit
    late: str | None = None  # refused only after something started


def row(process, flag, argv, when, why, field, starts, **defects) -> Row:
    return Row(process, flag, (argv,) if isinstance(argv, str) else tuple(argv), when, why, field, starts, **defects)


def warm(argv, when, why, field, starts, **defects) -> Row:
    """A warm-start flag: checked only when there is a warm start (and no --init_policy)."""
    flag = argv.split("=", 1)[0]
    when = f"{when} (with --warmstart_steps > 0)"
    return row(LEARNER, flag, ("--warmstart_steps=1", argv), when, why, field, starts, **defects)


def env_row(env, config, when, why, field, starts, **defects) -> Row:
    flag = f"--env_config {', '.join(config)} (--env={env})"
    argv = (f"--env={env}", f"--env_config={json.dumps(config)}")
    return Row(ENVIRONMENT, flag, argv, when, why, field, starts, **defects)


CHOICE = "not one of the choices"
R, L, E = ROLLOUT, LEARNER, EVALUATOR

TABLE: list[Row] = [
    # ---- the learner: python -m trainer.task ------------------------------------------
    row(L, "--requests_topic", (), "missing", "the feeder would have nowhere to publish requests",
        "--requests_topic", "the following arguments are required: --requests_topic", unset=("--requests_topic",)),
    row(L, "--model_config", "--model_config=huge", CHOICE, "no such model size",
        "--model_config", "argument --model_config: invalid choice: 'huge'"),
    row(L, "--loss", "--loss=sgd", CHOICE, "no such policy loss", "--loss", "argument --loss: invalid choice: 'sgd'"),
    row(L, "--aggregation", "--aggregation=sum", CHOICE, "no such token aggregation",
        "--aggregation", "argument --aggregation: invalid choice: 'sum'"),
    row(L, "--kl_estimator", "--kl_estimator=k9", CHOICE, "no such KL estimator",
        "--kl_estimator", "argument --kl_estimator: invalid choice: 'k9'"),
    row(L, "--warmstart_schedule", "--warmstart_schedule=linear", CHOICE, "no such learning-rate schedule",
        "--warmstart_schedule", "argument --warmstart_schedule: invalid choice: 'linear'"),
    row(L, "--warmstart_direct_at", "--warmstart_direct_at=never", CHOICE, "no such place to answer directly",
        "--warmstart_direct_at", "argument --warmstart_direct_at: invalid choice: 'never'"),
    row(L, "--env_config", "--env_config={bad", "not JSON", "the environment's settings cannot be read",
        "--env_config", "argument --env_config: invalid loads value: '{bad'"),
    row(L, "--buckets", "--buckets=128,abc", "not comma-separated integers", "no record length to pack into",
        "--buckets", "--buckets must be comma-separated integers"),
    row(L, "--buckets", "--buckets=256,128", "not strictly increasing",
        "a trajectory goes to the first bucket it fits: unsorted or repeated buckets make that choice wrong",
        "buckets", "buckets must be strictly increasing (sorted, no duplicates)"),
    row(L, "--buckets", "--buckets=0,256", "a length <= 0", "a record row with no room for a token",
        "buckets", "bucket sequence lengths must be positive ints"),
    row(L, "--seq_len", "--seq_len=0", "<= 0 (without --buckets)", "a record row with no room for a token",
        "seq_len", "bucket sequence lengths must be positive ints"),
    row(L, "--rows", "--rows=0", "<= 0", "records of no rows: nothing to train on", "rows",
        "rows must be a positive int"),
    row(L, "--max_segments_per_row", "--max_segments_per_row=0", "<= 0", "rows that may hold no trajectory",
        "max_segments_per_row", "max_segments_per_row must be a positive int"),
    row(L, "--max_trajectory_len", "--max_trajectory_len=0", "<= 0", "episodes that may not hold their prompt",
        "max_trajectory_len", "max_trajectory_len must be a positive int"),
    row(L, "--max_trajectory_len", "--max_trajectory_len=512", "> the largest bucket",
        "such a trajectory would fit no record", "max_trajectory_len", "max_trajectory_len 512 exceeds the largest"),
    row(L, "--mesh", "--mesh=data", "not like data=4,model=2", "no mesh shape to shard over",
        "--mesh", "--mesh must look like data=4,model=2"),
    row(L, "--mesh", "--mesh=data=0", "a size < 1", "a mesh of no devices",
        "--mesh", "--mesh takes positive sizes for the axes data and model only"),
    row(L, "--mesh", "--mesh=data=2,pipe=2", "an axis other than data and model",
        "the learner shards over data and model only", "--mesh",
        "--mesh takes positive sizes for the axes data and model only"),
    row(L, "--mesh", "--mesh=data=4096", "size != the devices present", "a mesh the devices cannot fill",
        "--mesh", "--mesh data=4096 needs 4096 devices"),
    row(L, "--eps_low", "--eps_low=1", "outside [0, 1)", "a lower clip at ratio 0 or below never binds",
        "eps_low", "need 0 <= eps_low < 1"),
    row(L, "--eps_high", "--eps_high=-0.1", "< 0", "an upper clip below ratio 1 clips every update",
        "eps_high", "need eps_high >= 0"),
    row(L, "--kl_coef", "--kl_coef=-0.1", "< 0", "a reward for drifting away from the reference policy",
        "kl_coef", "need kl_coef >= 0"),
    row(L, "--tis_cap", "--tis_cap=0", "<= 0", "a cap of 0 zeroes every importance weight: no gradient",
        "tis_cap", "tis_cap must be > 0"),
    row(L, "--batch_records", "--batch_records=0", "< 1", "a train step on no records",
        "batch_records", "batch_records must be >= 1"),
    row(L, "--learning_rate", "--learning_rate=-1", "< 0", "gradient ascent on the loss (0 is the RL-off control)",
        "learning_rate", "learning_rate must be >= 0"),
    row(L, "--learning_rate", "--learning_rate=nan", "NaN", "NaN weights after the first step",
        "learning_rate", "learning_rate must be >= 0"),
    row(L, "--publish_every", "--publish_every=0", "< 1", "a policy version every 0 steps",
        "publish_every", "publish_every must be >= 1"),
    row(L, "--env", "--env=chess", "not a registered environment", "no prompts to request",
        "env", "unknown environment 'chess'"),
    row(L, "--warmstart_steps", "--warmstart_steps=-1", "< 0", "a negative number of steps",
        "steps", "warm start steps must be an int >= 0"),
    warm("--warmstart_warmup=-1", "< 0", "a negative warmup", "warmup_steps",
         "warm start warmup_steps must be an int >= 0"),
    warm("--warmstart_batch=0", "< 1", "a behaviour-cloning step on no rows", "batch_rows",
         "warm start batch_rows must be a positive int"),
    warm("--warmstart_lr=0", "<= 0", "warm start steps that learn nothing (--warmstart_steps=0 skips it)",
         "learning_rate", "warm start learning_rate must be > 0"),
    warm("--warmstart_direct_frac=1.5", "outside [0, 1]", "not a share of the demonstrations", "direct_frac",
         "warm start direct_frac must lie in [0, 1]"),
    warm("--warmstart_tasks=0", "< 1", "a warm start with no demonstrations", "warmstart_tasks",
         "warmstart_tasks must be >= 1 with a warm start"),
    row(L, "--max_staleness", "--max_staleness=-1", "< 0", "every record is dropped as stale: the learner never trains",
        "max_staleness", "max_staleness must be an int >= 0"),
    row(L, "--max_mean_staleness", "--max_mean_staleness=3", "> --max_staleness", "a bound that can never bind",
        "max_mean_staleness", "max_mean_staleness must lie in [0, max_staleness=2]"),
    row(L, "--max_mean_staleness", "--max_mean_staleness=-0.5", "< 0",
        "the learner would wait for fresher data forever", "max_mean_staleness",
        "max_mean_staleness must lie in [0, max_staleness=2]"),
    row(L, "--group_size", "--group_size=0", "< 1", "requests of no episodes: no trajectory ever comes back",
        "group_size", "need max_batches_ahead >= 0, batch_records >= 1, group_size >= 1"),
    row(L, "--max_batches_ahead", "--max_batches_ahead=-1", "< 0",
        "a credit window smaller than one batch: the learner waits forever", "max_batches_ahead",
        "need max_batches_ahead >= 0"),
    row(L, "--max_in_flight", "--max_in_flight=10", "< batch_records x rows x segments + group_size",
        "deadlock: the next batch may need more trajectories than the window lets out", "max_in_flight",
        "max_in_flight=10 could deadlock"),
    row(L, "--request_timeout_s", "--request_timeout_s=0", "<= 0 or not finite",
        "every request written off at once (or never: a lost request holds its credits for good)",
        "request_timeout_s", "request_timeout_s must be a positive number of seconds"),
    row(L, "--ack_deadline_s", "--ack_deadline_s=5", "outside [10, 600]", "Pub/Sub refuses such a deadline",
        "ack_deadline_s", "ack_deadline_s must be an int in [10, 600]"),
    row(L, "--ack_extend_every_s", "--ack_extend_every_s=90", ">= --ack_deadline_s / 2",
        "records held for their checkpoint would be redelivered while held", "extend_every_s",
        "extend_every_s must be in (0, ack_deadline_s / 2"),
    # ---- the rollout job: python -m pipelines.rollout -------------------------------
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
    row(R, "--rows", "--rows=0", "<= 0", "records of no rows", "rows", "rows must be a positive int"),
    row(R, "--buckets", "--buckets=256,128", "not strictly increasing", "the bucket choice would be wrong",
        "buckets", "buckets must be strictly increasing"),
    row(R, "--seq_len", "--seq_len=0", "<= 0 (without --buckets)", "a record row with no room for a token",
        "seq_len", "bucket sequence lengths must be positive ints"),
    row(R, "--max_trajectory_len", "--max_trajectory_len=300", "> the largest bucket",
        "episodes that would fit no record", "max_trajectory_len", "max_trajectory_len 300 exceeds the largest"),
    row(R, "--engine_slots", "--engine_slots=0", "<= 0", "an engine that can decode no episode",
        "slots", "slots must be a positive int"),
    row(R, "--max_concurrent_groups", "--max_concurrent_groups=0", "<= 0", "a worker that runs no request",
        "max_concurrent_groups", "max_concurrent_groups must be a positive int"),
    row(R, "--request_shards", "--request_shards=0", "<= 0", "no keys to spread requests over",
        "request_shards", "request_shards must be a positive int"),
    row(R, "--max_new_tokens_per_turn", "--max_new_tokens_per_turn=0", "<= 0", "turns that generate nothing",
        "max_new_tokens_per_turn", "max_new_tokens_per_turn must be a positive int"),
    row(R, "--max_new_tokens_per_turn", "--max_new_tokens_per_turn=256", ">= the longest trajectory",
        "a turn that leaves no room for the prompt", "max_new_tokens_per_turn",
        "max_new_tokens_per_turn (256) must be below max_tokens (256)"),
    row(R, "--commit_interval_s", "--commit_interval_s=0", "not a positive finite number",
        "a commit timer that fires without pause, or never", "commit_interval_s",
        "commit_interval_s must be a positive finite number of seconds"),
    row(R, "--policy_poll_s", "--policy_poll_s=0", "not a positive finite number",
        "polling the policy store without pause", "policy_poll_s",
        "policy_poll_s must be a positive finite number of seconds"),
    row(R, "--policy_wait_s", "--policy_wait_s=-1", "not a positive finite number",
        "requests run before any policy exists", "policy_wait_s",
        "policy_wait_s must be a positive finite number of seconds"),
    row(R, "--telemetry_every_s", "--telemetry_every_s=inf", "not a positive finite number",
        "telemetry rows never (or always) written", "telemetry_every_s",
        "telemetry_every_s must be a positive finite number of seconds"),
    row(R, "--num_shards", "--num_shards=0", "<= 0", "no packing keys: nothing is ever packed",
        "num_shards", "num_shards must be a positive int"),
    row(R, "--window_s", "--window_s=0", "not a positive finite number", "packing windows of no length",
        "window_s", "window_s must be a positive finite number of seconds"),
    row(R, "--max_wait_s", "--max_wait_s=nan", "not a positive finite number",
        "a flush timer that never fires: part-filled records wait forever", "max_wait_s",
        "max_wait_s must be a positive finite number of seconds"),
    row(R, "--step_timeout_s", "--step_timeout_s=0", "not a positive finite number",
        "every tool call would time out at once", "step_timeout_s",
        "step_timeout_s must be a positive finite number of seconds"),
    row(R, "--dedup_window_s", "--dedup_window_s=0", "not a positive finite number",
        "ids forgotten at once: duplicates are packed again", "dedup_window_s",
        "dedup_window_s must be a positive finite number of seconds"),
    row(R, "--allowed_lateness_s", "--allowed_lateness_s=-1", "< 0 or infinite",
        "a negative lateness, or per-key state kept forever", "allowed_lateness_s",
        "allowed_lateness_s must be finite and >= 0"),
    row(R, "--window_s", "--window_s=1", "< --max_wait_s", "the window end always comes first: a dead max_wait_s",
        "window_s", "window_s (1.0) must be >= max_wait_s (2.0)"),
    row(R, "--rows", "--rows=1024", "a record over the Pub/Sub message cap",
        "records the topic cannot carry: the learner starves", "rows", "a 1024x256 record (up to 4096 trajectories)"),
    row(R, "--rows", "--rows=65537", "rows x seq_len over the decoder's cell cap", "records no decoder accepts",
        "rows", "record shape 65537x256 is over 16777216 cells"),
    # ---- the evaluator: python -m rollout.evaluator -------------------------------
    row(E, "--out", (), "missing", "scores written nowhere", "--out",
        "the following arguments are required: --out", unset=("--out",)),
    row(E, "--model_config", "--model_config=huge", CHOICE, "no such model size",
        "--model_config", "argument --model_config: invalid choice: 'huge'"),
    row(E, "--env_config", "--env_config={bad", "not JSON", "the environment's settings cannot be read",
        "--env_config", "argument --env_config: invalid loads value: '{bad'"),
    row(E, "--modes", "--modes=beam", "a mode other than sampled, greedy", "no such way to decode",
        "--modes", "--modes must name some of ('sampled', 'greedy')"),
    row(E, "--modes", "--modes=,", "empty", "an evaluation that scores nothing",
        "--modes", "--modes must name some of ('sampled', 'greedy')"),
    row(E, "--n", "--n=-1", "< 0", "a negative number of held-out tasks", "n", "n must be an int >= 0"),
    row(E, "--env", "--env=chess", "not a registered environment", "no held-out tasks",
        "env", "unknown environment 'chess'"),
    row(E, "--max_new_tokens_per_turn", "--max_new_tokens_per_turn=0", "< 1", "turns that generate nothing",
        "max_new_tokens_per_turn", "episode token limits must be >= 1"),
    row(E, "--max_tokens", "--max_tokens=0", "< 1", "episodes that cannot hold their prompt",
        "max_tokens", "episode token limits must be >= 1"),
    row(E, "--max_tokens", "--max_tokens=512", "> the model's context (tiny: 256)",
        "a KV cache longer than the model's context", "max_tokens", "sampler length 512 exceeds the model's"),
    row(E, "--slots", "--slots=0", "< 1", "a sampler that decodes no episode", "slots", "need slots >= 1"),
    # ---- the demo: python -m localstack.launch.demo ----------------------------------------
    row(DEMO, "--live", "--live=tv", CHOICE, "no such progress display", "--live",
        "argument --live: invalid choice: 'tv'"),
    row(DEMO, "--max_restarts", "--max_restarts=-1", "< 0", "no number of restarts", "--max_restarts",
        "--max_restarts must be >= 0"),
    row(DEMO, "--rollout_cpus", "--rollout_cpus=0,a", "not a comma-separated list of core numbers",
        "no cores to pin the rollout side to", "rollout_cpus", "--rollout_cpus must be comma-separated core numbers"),
    # ---- the Vertex AI launcher: python -m trainer.cloud.vertex ---------------------
    row(VERTEX, "--project", "--project=My_Project", "not a GCP project id", "a job the API refuses after upload",
        "project", "project 'My_Project' is not a GCP project id"),
    row(VERTEX, "--region", "--region=us-central1-a", "a zone or not a region", "Vertex AI jobs live in regions",
        "region", "region 'us-central1-a' is not a region like us-central1"),
    row(VERTEX, "--image", "--image=learner", "not a container image URI", "no container to run",
        "image_uri", "image_uri 'learner' is not a container image URI"),
    row(VERTEX, "--base_output_dir", "--base_output_dir=/tmp/learner", "not gs://bucket[/path]",
        "Vertex AI derives the model and checkpoint dirs from a GCS prefix", "base_output_dir",
        "base_output_dir must be a gs://bucket[/path] URI"),
    row(VERTEX, "--staging_bucket", "--staging_bucket=s3://bucket", "not gs://bucket[/path]",
        "the SDK stages to GCS only", "staging_bucket", "staging_bucket must be a gs://bucket[/path] URI"),
    row(VERTEX, "--display_name", "--display_name=", "empty or over 128 characters", "the API's limits",
        "display_name", "display_name must be 1-128 characters"),
    row(VERTEX, "--replica_count", "--replica_count=0", "< 1", "a job with no learner host",
        "replica_count", "replica_count must be an int >= 1"),
    row(VERTEX, "--service_account", "--service_account=learner", "not an email",
        "no identity to run the job as", "service_account", "service_account 'learner' is not an email"),
    row(VERTEX, "--env", "--env=DEBUG", "not NAME=VALUE", "a variable with no value", "--env",
        "--env wants NAME=VALUE"),
    row(VERTEX, "--env", "--env=AIP_MODEL_DIR=gs://b/m", "an invalid or Vertex-reserved name",
        "overriding Vertex's own variables would mislead trainer.cloud.distributed", "env",
        "env var 'AIP_MODEL_DIR' is invalid or reserved by Vertex AI"),
    row(VERTEX, "--tpu_topology", "--tpu_topology=", "empty on a TPU machine type",
        "Vertex AI needs the slice's topology", "tpu_topology",
        "TPU machine type ct5lp-hightpu-4t needs a tpu_topology"),
    row(VERTEX, "--machine_type", "--machine_type=n1-standard-8", "not a TPU type while a topology is given",
        "a TPU topology for a machine with no TPU", "tpu_topology", "tpu_topology given for non-TPU machine type"),
    row(VERTEX, "--tpu_topology", "--tpu_topology=2by2", "not like 2x2 or 2x2x1", "no slice shape",
        "tpu_topology", "tpu_topology '2by2' is not like 2x2 or 2x2x1"),
    row(VERTEX, "--tpu_topology", "--tpu_topology=1x2", "chips not a multiple of the chips per host",
        "a slice the hosts cannot fill", "tpu_topology", "topology 1x2 (2 chips) does not fill"),
    row(VERTEX, "-- (learner flags)", ("--", "--loss=sgd"), "refused by trainer.task's parser",
        "a typo fails here, not on a TPU", "learner args", "trainer.task refuses the learner args"),
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
            "tool_latency", "LatencyModel.seconds must be >= 0"),
    env_row("calculator", {"tool_latency": "fixed:inf"}, "a parameter not finite", "a tool call that never returns",
            "tool_latency", "LatencyModel.seconds must be a finite number"),
    env_row("calculator", {"tool_latency": "uniform:2:1"}, "uniform low > high", "an empty interval",
            "tool_latency", "uniform latency needs low <= high"),
    env_row("calculator", {"tool_latency": "lognormal:0:1"}, "lognormal median <= 0",
            "log(0): no distribution", "tool_latency", "lognormal latency needs median > 0"),
    env_row("guess", {"low": 10, "high": 1}, "low > high", "an empty range to guess in",
            "low", "GuessConfig needs low <= high"),
    env_row("guess", {"max_turns": 0}, "< 1", "an episode that ends before the first guess",
            "max_turns", "GuessConfig.max_turns must be >= 1"),
    env_row("guess", {"high": 1.5}, "not an int", "a range of non-integers", "high", "GuessConfig.high must be an int"),
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
            "memory_bytes", "SandboxLimits.memory_bytes must be >= 64 MiB"),
    env_row("code", {"sandbox": {"cpu_seconds": 0}}, "< 1", "every program killed before it runs",
            "cpu_seconds", "SandboxLimits.cpu_seconds must be an int >= 1"),
]  # fmt: skip

# ---------------------------------------------------------------------------- starting a process

LEARNER_BASE = (
    "--requests_topic=projects/my-project/topics/requests",
    "--records_subscription=projects/my-project/subscriptions/records",
    "--policy_root=/nonexistent/policy-store",
)
ROLLOUT_BASE = (
    "--requests_subscription=projects/my-project/subscriptions/requests",
    "--records_topic=projects/my-project/topics/records",
    "--policy_root=/nonexistent/policy-store",
)
EVALUATOR_BASE = ("--policy_root=/nonexistent/policy-store", "--out=/nonexistent/eval.jsonl")
VERTEX_BASE = (
    "--project=my-project",
    "--region=us-central1",
    "--image=us-docker.pkg.dev/my-project/rl/learner:v1",
    "--base_output_dir=gs://my-bucket/learner",
)


class Reached(Exception):
    """The process got past every check to where it starts its work: nothing was refused."""


def _argv(base, r: Row) -> list[str]:
    kept = [a for a in base if a.split("=", 1)[0] not in r.unset]
    return kept + list(r.argv)


def _learner(argv, events):
    """trainer.task.run, up to starting the feeder thread; the model, the warm start, the
    policy publish and the records subscription are recorded, not made."""

    def learner(model_cfg, cfg, mesh):
        events.append("model built")
        return types.SimpleNamespace(cfg=cfg, params={}, graphdef=None, mesh=mesh, set_reference=lambda p: None)

    def warm_start(graphdef, params, env, demos, cfg):
        events.append("warm start")
        return params, [0.0]

    def publisher(args, learner, checkpointer, start):
        return types.SimpleNamespace(version=-1, publish_start=lambda resumed: events.append("policy v0 published"))

    def consumer(*args, **kwargs):
        events.append("records subscription opened")
        return mock.MagicMock()

    class Feeder:
        def __init__(self, *args, **kwargs):
            pass

        def start(self):
            events.append("feeder started")
            raise Reached

    fakes = {
        "Learner": learner,
        "warm_start": warm_start,
        "make_publisher": publisher,
        "RecordConsumer": consumer,
        "Feeder": Feeder,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}  # Vertex's defaults for flags
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, env, clear=True))
        stack.enter_context(mock.patch.object(trace, "_current", trace.current()))  # run() installs its tracer
        for name, fake in fakes.items():
            stack.enter_context(mock.patch.object(builder, name, fake))
        task.run(task.parse_args(argv))


def _rollout(argv, events):
    """pipelines.rollout.run on its default (direct) runner, up to running the pipeline.

    build() is stood in for by the two config checks it makes, in its order (the real
    build takes ~1 s a row; test_rollout_build_checks_like_the_stand_in runs it once)."""

    class NoPipeline:
        def __init__(self, options=None, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def heartbeat(subscription, interval_s):
        events.append("heartbeat started")
        return threading.Event()

    def build(p, options):
        engine_config(options)
        packing_config(options.view_as(RolloutOptions))
        events.append("pipeline run")
        raise Reached

    with contextlib.ExitStack() as stack:
        for name, fake in (("memoise_dofn_specs", lambda: None), ("share_pubsub_publishers", lambda: None)):
            stack.enter_context(mock.patch.object(rollout, name, fake))  # process-wide patches: not here
        stack.enter_context(mock.patch.object(rollout, "start_heartbeat", heartbeat))
        stack.enter_context(mock.patch.object(rollout, "build", build))
        stack.enter_context(mock.patch.object(rollout.beam, "Pipeline", NoPipeline))
        rollout.run(argv)


def _evaluator(argv, events):
    """rollout.evaluator.run, up to its first look at the policy store."""

    def store(root):
        events.append("policy store polled")
        raise Reached

    with mock.patch.object(evaluator, "PolicyStore", store):
        evaluator.run(evaluator.build_parser().parse_args(argv))


def _demo(argv, events):
    """localstack.launch.demo.run_local, up to the planner and the emulator; its watchdog is recorded."""

    def pinned(*args, **kwargs):
        events.append("planner and emulator started")
        raise Reached

    with tempfile.TemporaryDirectory() as workdir, contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(processes, "start_watchdog", lambda: events.append("watchdog started")))
        stack.enter_context(mock.patch.object(os, "sched_setaffinity", lambda pid, cpus: None))
        stack.enter_context(mock.patch.object(demo, "_run_pinned", pinned))
        demo.run_local(demo.parse_args([f"--workdir={workdir}", *argv]))


def _vertex(argv, events):
    """trainer.cloud.vertex.main, up to building the job (which a real run then submits)."""

    def job(cfg):
        events.append("job built")
        raise Reached

    cut = argv.index("--") if "--" in argv else len(argv)
    with mock.patch.object(vertex, "build_custom_job", job):
        vertex.main([*argv[:cut], "--", *LEARNER_BASE, *argv[cut + 1 :]])


def _environment(argv, events):
    """The learner started with --env/--env_config, then what every rollout worker does
    with each request (pipelines/transforms.py) and the evaluator with each task."""
    argv = [*LEARNER_BASE, *argv]
    with contextlib.suppress(Reached):
        _learner(argv, events)
    args = task.parse_args(argv)
    environments.make(args.env, **args.env_config)


START = {
    LEARNER: (_learner, LEARNER_BASE),
    ROLLOUT: (_rollout, ROLLOUT_BASE),
    EVALUATOR: (_evaluator, EVALUATOR_BASE),
    DEMO: (_demo, ()),
    VERTEX: (_vertex, VERTEX_BASE),
    ENVIRONMENT: (_environment, ()),
}


@dataclasses.dataclass(frozen=True)
class Outcome:
    error: BaseException | None  # None: not refused
    message: str
    events: tuple[str, ...]  # what had started when it was refused


def _message(e: BaseException, stderr: str) -> str:
    if isinstance(e, SystemExit) and not isinstance(e.code, str):  # argparse: "PROG: error: MESSAGE"
        errors = [line.split(": error: ", 1)[1] for line in stderr.splitlines() if ": error: " in line]
        return errors[-1] if errors else ""
    if isinstance(e, SystemExit):
        return e.code
    return e.args[0] if isinstance(e, KeyError) and e.args else str(e)


@functools.cache
def outcome(r: Row) -> Outcome:
    start, base = START[r.process]
    events, stderr = [], io.StringIO()
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(stderr):
            start(_argv(base, r), events)
    except (ValueError, SystemExit, TypeError, KeyError) as e:
        return Outcome(e, _message(e, stderr.getvalue()), tuple(events))
    except Reached:
        pass
    finally:
        logging.disable(logging.NOTSET)
    return Outcome(None, "", tuple(events))


def names(message: str, field: str) -> bool:
    """The field as a word of its own: `slots` is named by "slots must be", not by "engine_slots"."""
    return re.search(rf"(?<!\w){re.escape(field)}(?!\w)", message) is not None


# ---------------------------------------------------------------------------- the tests


def _id(r: Row) -> str:
    unset = [f"unset {f}" for f in r.unset]
    return f"{r.process} {' '.join([*unset, *r.argv])}"


def _params(defect):
    """One pytest param per row, a strict xfail where `defect(row)` gives a reason."""
    params = []
    for r in TABLE:
        reason = defect(r)
        marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)] if reason else []
        params.append(pytest.param(r, id=_id(r), marks=marks))
    return params


def _wrong_type(r: Row) -> str | None:
    return r.wrong_type and f"refused with {r.wrong_type}, not ValueError or SystemExit"


@pytest.mark.parametrize("r", _params(_wrong_type))
def test_refused_with_documented_message(r: Row):
    out = outcome(r)
    assert out.error is not None, f"accepted; got as far as {out.events}"
    assert isinstance(out.error, (ValueError, SystemExit)), f"{type(out.error).__name__}: {out.message}"
    assert out.message.startswith(r.starts), out.message


@pytest.mark.parametrize("r", _params(lambda r: "message does not name the field" if r.not_named else None))
def test_message_names_the_field(r: Row):
    out = outcome(r)
    assert out.error is not None, f"accepted; got as far as {out.events}"
    assert names(out.message, r.field), f"{r.field!r} not in {out.message!r}"


@pytest.mark.parametrize("r", _params(lambda r: r.late and f"refused only {r.late}"))
def test_refused_before_anything_starts(r: Row):
    out = outcome(r)
    assert out.error is not None, f"accepted; got as far as {out.events}"
    assert out.events == (), f"started before the refusal: {out.events}"


def test_rows_are_distinct():
    keys = [(r.process, r.argv, r.unset) for r in TABLE]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]


def test_names_matches_whole_words():
    assert names("slots must be a positive int", "slots")
    assert not names("engine_slots must be a positive int", "slots")
    assert names("the following arguments are required: --out", "--out")
    assert not names("bucket sequence lengths must be positive ints", "buckets")


def test_rollout_build_checks_like_the_stand_in():
    """The real build() refuses what _rollout's stand-in for it refuses, before the pipeline runs."""
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions([*ROLLOUT_BASE, "--num_shards=0"])
    pipeline = rollout.beam.Pipeline(options=options)  # never run: not entered as a context
    with pytest.raises(ValueError, match=r"^num_shards must be a positive int"):
        rollout.build(pipeline, options)
    stand_in = next(r for r in TABLE if r.process == ROLLOUT and r.argv == ("--num_shards=0",))
    assert outcome(stand_in).message.startswith("num_shards must be a positive int")


# ---------------------------------------------------------------------------- the doc

HEADER = """\
# Settings refused at start-up

Generated from the table in `tests/test_config_refusals.py`, which passes each setting the
way a user would and checks the refusal: edit the table, then run
`python -m tests.test_config_refusals --write` (a test fails while this file and the table
differ). Argument types (`--rows=abc`) are argparse's own checks and are not listed.
The `environments.make` rows are keys of `--env_config` (learner, evaluator): they are
checked where an environment is made, in every rollout worker and in the evaluator.

Marks: **†** the message does not name the flag or field yet; **‡** refused with another
exception than ValueError / SystemExit; **§** refused only after something has started
(the note says what).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    lines = [
        HEADER,
        "| process | flag / field | refused when | why (the deadlock or nonsense it prevents) | message starts with |",
        "|---|---|---|---|---|",
    ]
    for r in TABLE:
        marks = "".join(m for m, on in (("†", r.not_named), ("‡", r.wrong_type), ("§", r.late)) if on)
        when = r.when + (f" (§ refused only {r.late})" if r.late else "")
        message = f"`{r.starts}`" + (f" {marks}" if marks else "")
        cells = [f"`{r.process}`", f"`{r.flag}`", when, r.why, message]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def test_doc_matches_table():
    assert DOC.read_text() == render(), "docs/CONFIG_REFUSALS.md is stale: python -m tests.test_config_refusals --write"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_config_refusals --write")
    DOC.write_text(render())
    print(f"wrote {DOC} ({len(TABLE)} rows)")


def test_the_readme_table_lists_only_refusals_this_table_checks():
    """README's short table ("Settings refused at start") must not promise a refusal that
    is not a row here (rollout flags are marked "rollout", the rest are the learner's)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Settings refused at start", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `") or line.startswith("| rollout")]
    assert len(rows) >= 10
    for line in rows:
        cell = line.split("|")[1]
        process = ROLLOUT if cell.strip().startswith("rollout") else LEARNER
        for flag in re.findall(r"`(--[a-z_]+)\*?`", cell):
            have = {r.flag for r in TABLE if r.process == process}
            assert any(f == flag or f.startswith(flag) for f in have), (process, flag)
