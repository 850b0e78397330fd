"""The machinery behind the config-refusal tables (tests/test_config_refusals_*.py, one file a role).

Each row is passed the way a user passes it (the process's own argument parser and the
entry function it runs at start: `trainer.task.run`, `pipelines.job.run`,
`rollout.evaluator.run`, `localstack.launch.demo.run_local`, `trainer.cloud.vertex.main`;
`environments.make` for --env_config, as every rollout worker and the evaluator call it),
with whatever would start something (a model, a warm start, a policy publish, the feeder,
a heartbeat, a pipeline, a watchdog, a job) replaced by a recorder. Three checks a row
(`checks(table)` makes them the table's test functions):
  * refused: ValueError or SystemExit, with the message the table documents;
  * the message names the flag or field (`field`);
  * nothing had started when it was refused.
A row that fails one of them today carries the defect (`not_named`, `wrong_type`,
`late`) and that check is a strict xfail: fixing the code turns it into an XPASS, and
the row's mark goes.
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
import tempfile
import threading
import types
from unittest import mock

import pytest

import environments
from core.telemetry import trace
from localstack.launch import demo, processes
from pipelines import job
from pipelines.options import rollout_config
from rollout import evaluator
from trainer import task
from trainer.cloud import vertex
from trainer.learning import builder

LEARNER, ROLLOUT, EVALUATOR = "trainer.task", "pipelines.job", "rollout.evaluator"
DEMO, VERTEX, ENVIRONMENT = "localstack.launch.demo", "trainer.cloud.vertex", "environments.make"
# The order of the processes in docs/CONFIG_REFUSALS.md.
PROCESSES = (LEARNER, ROLLOUT, EVALUATOR, DEMO, VERTEX, ENVIRONMENT)

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

    def learner(model_cfg, cfg, mesh, model=None):
        events.append("model built")
        return types.SimpleNamespace(
            cfg=cfg, params={}, graphdef=None, frozen=None, mesh=mesh, set_reference=lambda p: None
        )

    def warm_start(graphdef, params, env, demos, cfg, fmt=None, frozen=None, env_config=None, compute=None):
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
        task.run(task.parse_config(argv))


def _rollout(argv, events):
    """pipelines.job.run on its default (direct) runner, up to running the pipeline.

    build() is stood in for by the config check it makes (the real build takes ~1 s a
    row; test_rollout_build_checks_like_the_stand_in runs it once)."""

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
        rollout_config(options)
        events.append("pipeline run")
        raise Reached

    with contextlib.ExitStack() as stack:
        # Process-wide patches of Beam: not here.
        stack.enter_context(mock.patch.object(job.direct_runner, "apply", lambda **_: False))
        stack.enter_context(mock.patch.object(job, "start_heartbeat", heartbeat))
        stack.enter_context(mock.patch.object(job, "build", build))
        stack.enter_context(mock.patch.object(job.beam, "Pipeline", NoPipeline))
        job.run(argv)


def _evaluator(argv, events):
    """rollout.evaluator.run, up to its first look at the policy store."""

    def store(root):
        events.append("policy store polled")
        raise Reached

    with mock.patch.object(evaluator, "PolicyStore", store):
        evaluator.run(evaluator.parse_args(argv))


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
    args = task.parse_config(argv)
    environments.make(args.env.name, **args.env.settings)


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


# ---------------------------------------------------------------------------- the checks


def _id(r: Row) -> str:
    unset = [f"unset {f}" for f in r.unset]
    return f"{r.process} {' '.join([*unset, *r.argv])}"


def _params(table, defect):
    """One pytest param per row, a strict xfail where `defect(row)` gives a reason."""
    params = []
    for r in table:
        reason = defect(r)
        marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)] if reason else []
        params.append(pytest.param(r, id=_id(r), marks=marks))
    return params


def _wrong_type(r: Row) -> str | None:
    return r.wrong_type and f"refused with {r.wrong_type}, not ValueError or SystemExit"


def checks(table: list[Row]):
    """The three checks of every row of `table`, as test functions for the module that holds it."""

    @pytest.mark.parametrize("r", _params(table, _wrong_type))
    def test_refused_with_documented_message(r: Row):
        out = outcome(r)
        assert out.error is not None, f"accepted; got as far as {out.events}"
        assert isinstance(out.error, (ValueError, SystemExit)), f"{type(out.error).__name__}: {out.message}"
        assert out.message.startswith(r.starts), out.message

    @pytest.mark.parametrize("r", _params(table, lambda r: "message does not name the field" if r.not_named else None))
    def test_message_names_the_field(r: Row):
        out = outcome(r)
        assert out.error is not None, f"accepted; got as far as {out.events}"
        assert names(out.message, r.field), f"{r.field!r} not in {out.message!r}"

    @pytest.mark.parametrize("r", _params(table, lambda r: r.late and f"refused only {r.late}"))
    def test_refused_before_anything_starts(r: Row):
        out = outcome(r)
        assert out.error is not None, f"accepted; got as far as {out.events}"
        assert out.events == (), f"started before the refusal: {out.events}"

    return test_refused_with_documented_message, test_message_names_the_field, test_refused_before_anything_starts
