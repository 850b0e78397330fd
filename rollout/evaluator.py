"""The evaluator: scores every published policy version on held-out tasks, beside the
learner and outside the training data path.

    agentic-rl evaluate --policy_root RUN/policy-store --env calculator \\
        --n 256 --out RUN/eval.jsonl [--stop_file RUN/final_version]

Its own process: locally the demo starts it next to the learner; in the cloud it runs
next to the Vertex AI learner job (or anywhere) against the gs:// store. It polls the
store and evaluates the newest version it has not scored yet, in every mode (sampled at
temperature 1, and greedy), on N test-split tasks; versions published while it was busy
are skipped and counted, never queued without bound. Each (version, mode) becomes one
JSON row of --out: success and its standard error, pass@k with --samples > 1, mean
turns, tool-call error rate, episode statuses, the version's learner step and publish
time. With --temperatures the first version is also scored at each of them (mode
"sweep", its temperature in the row): pass@1 of v0 at a lower temperature is what RL
must beat to show more than sharpening. With --stop_file, once that file holds the final
version number, it scores that version too and exits, giving up an evaluation of an
earlier version it is in the middle of. Its episodes never produce trajectories or
records, so evaluation never trains. Its flags are EvaluatorConfig's
(`python -m rollout.evaluator` is the same command).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import environments
from core import config, heap, process_memory
from core.config import configclass, knob, section
from core.contracts.record_shape import DEFAULT_MAX_TRAJECTORY_LEN
from core.contracts.store import PolicyStore, StoreError
from core.policy.sampling.sampler import DTYPES, Sampler, cast_params, serving_dtype
from core.policy.sources import policy_spec
from core.policy.text.chat_format import chat_format_for
from core.policy.versions import VersionLoader, base_params
from core.rl.pass_at_k import SWEEP_MODE
from core.sections import EnvChoice, ModelChoice, TelemetryDirs, TurnBudget
from core.telemetry import scalars, trace
from rollout.episodes import EpisodeLimits
from rollout.scoring import MODES, Superseded, evaluate

log = logging.getLogger("evaluator")


@configclass(kw_only=True)
class EvaluatorConfig:
    """The evaluator's flags; checked where they are used (`run`), before any model is built."""

    policy_root: str = knob(help="policy store root: a directory or gs://…", wiring=True)
    out: str = knob(help="JSONL file, one row per (version, mode)", wiring=True)
    # Scoring measures success, not time: no simulated tool latency unless --env_config has one.
    env: EnvChoice = section(EnvChoice, help="the environment whose test split is scored", hide=("tool_latency",))
    n: int = knob(256, "held-out tasks per evaluation (the demo: 0 turns evaluation off)", ge=0)
    task_seed: int = knob(0, "seed of the held-out tasks")
    data_dir: str | None = knob(None, "read the test split from the environment's TFDS dataset", wiring=True)
    modes: str = knob(",".join(MODES), f"comma-separated, from {MODES}")
    samples: int = knob(
        1,
        "sampled episodes per task in the sampled mode (and the sweep): pass@k for k = 1, 2, 4 .. samples "
        "(Chen et al.'s unbiased estimator); costs samples x the episodes",
        ge=1,
    )
    samples_at: str = knob(
        "ends",
        "which versions get --samples per task: every one evaluated, or only the first and the final "
        "(the others one, pass@1 alone)",
        choices=("every", "ends"),
    )
    temperatures: str = knob(
        "",
        "the first version's temperature sweep: comma-separated temperatures (> 0) it is also scored at, "
        "--samples per task, a row each (mode sweep); the control that tells sharpening from learning "
        "(1 is the sampled mode's own row)",
    )
    greedy_at: str = knob(
        "every",
        "which versions the greedy mode scores: every one evaluated, or only the first and the final "
        "(--stop_file's), which spares a slow model's run half of its evaluation",
        choices=("every", "ends"),
    )
    model: ModelChoice = section(ModelChoice, help="the policy model (the learner's)")
    max_tokens: int = knob(DEFAULT_MAX_TRAJECTORY_LEN, "episode length cap (the layout's max_trajectory_len)", ge=1)
    turn: TurnBudget = section(TurnBudget, help="tokens one model turn may generate")
    slots: int = knob(64, "episodes decoded at once", ge=1)
    prefill: int = knob(32, "tokens each slot is fed per catch-up step (prompts, observations)", ge=1)
    prefill_slots: int = knob(8, "slots fed a catch-up chunk per engine step (the others with input wait)", ge=1)
    decode_steps: int = knob(
        0, "decode steps per device call, as the rollout's --engine_decode_steps (0: auto, 1 on a CPU)", ge=0
    )
    dtype: str = knob(
        "auto", "params and KV cache dtype (auto: bfloat16 on an accelerator, float32 on a CPU)", choices=DTYPES
    )
    episode_timeout_s: float = knob(
        120.0, "an episode longer than this (wall clock) ends as timeout: raise it for a slow model on many slots"
    )
    poll_s: float = knob(1.0, "how often the store is looked at for a new version", gt=0)
    stop_file: str | None = knob(None, "holds the final version once the learner is done", wiring=True)
    timeout_s: float = knob(3600.0, "give up (exit 1) after this long", gt=0)
    seed: int = knob(0, "sampling seed")
    examples: int = knob(
        2, "transcripts kept of each failure class per evaluation, in OUT's .examples.jsonl (0: none)", ge=0
    )
    nice: int = knob(0, "lower this process's CPU priority (shared machines)")
    telemetry: TelemetryDirs = section(TelemetryDirs, help="eval/... scalars and spans")


def parse_args(argv=None) -> EvaluatorConfig:
    return config.parse(EvaluatorConfig, argv, description=__doc__, prog="agentic-rl evaluate")


def held_out_tasks(args) -> list:
    environments.load_entry_points()
    env, env_config = args.env.name, args.env.config
    if env not in environments.names():
        raise ValueError(f"unknown environment {env!r} (--env); known: {environments.names()}")
    if not args.data_dir:
        return environments.make_tasks(env, args.task_seed, args.n, "test", env_config)
    from environments import datasets

    datasets.build(env, args.data_dir, seed=args.task_seed, env_config=env_config)
    tasks = list(datasets.load_tasks(env, "test", args.data_dir))
    if len(tasks) < args.n:
        raise SystemExit(f"--n={args.n} but the test split in {args.data_dir} holds {len(tasks)} tasks")
    return tasks[: args.n]


def final_version(stop_file: str | None) -> int | None:
    if not stop_file or not Path(stop_file).exists():
        return None
    text = Path(stop_file).read_text().strip()
    return int(text) if text.isdigit() else None


def _superseded(stop_file: str | None, version: int) -> bool:
    """Once the learner is done, a version before the final one is not worth finishing: at a
    real model's size an evaluation takes minutes, and the final version waits behind it."""
    final = final_version(stop_file)
    return final is not None and final > version


def run(args: EvaluatorConfig) -> list[dict]:
    process_memory.start_tracing()  # with AGENTIC_RL_TRACEMALLOC (a soak): where memory grows
    writer, tracer = (
        scalars.make_writer(args.telemetry.logdir, "evaluator"),
        trace.make_tracer(args.telemetry.trace_dir, "evaluator"),
    )
    try:
        return _run(args, writer, tracer)
    finally:
        writer.close()
        tracer.close()


def _run(args, writer, tracer) -> list[dict]:
    if args.nice:
        os.nice(args.nice)  # on a shared box evaluation yields to training and skips versions instead
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes must name some of {MODES}, got {args.modes!r}")
    sweep = sweep_temperatures(args.temperatures)
    spec = policy_spec(args.model.checkpoint, args.model.builtin)
    tasks = held_out_tasks(args)
    limits = EpisodeLimits(
        max_new_tokens_per_turn=args.turn.max_new_tokens_per_turn,
        max_tokens=args.max_tokens,
        episode_timeout_s=args.episode_timeout_s,
    )
    # One sampler (one KV cache) for every mode: they take turns.
    # No more slots than tasks: each slot is a KV cache of max_tokens (0.66 GB per 32 slots
    # of 448 tokens at SmolLM2's size), and a slot without a task only costs memory.
    slots = min(args.slots, len(tasks))
    dtype = serving_dtype(args.dtype)
    sampler = Sampler(
        spec.cfg,
        slots,
        args.max_tokens,
        args.prefill,
        args.seed,
        prefill_slots=min(args.prefill_slots, slots),
        dtype=dtype,
        decode_steps=args.decode_steps,
    )
    store, fmt = PolicyStore(args.policy_root), chat_format_for(spec.tokenizer)
    loader = VersionLoader(store, spec.cfg, sampler.abstract_params, base_params(spec.checkpoint))
    out, rows, done, skipped = Path(args.out), [], -1, 0
    scored: dict[int, set[str]] = {}  # version -> the modes it has a row for (at the ends' samples)
    out.parent.mkdir(parents=True, exist_ok=True)
    episode_args = (args.env.name, tasks, limits, args.env.config, fmt, args.examples)
    deadline = time.monotonic() + args.timeout_s
    while time.monotonic() < deadline:
        final = final_version(args.stop_file)
        try:
            versions = [v for v in store.versions() if v > done]
        except StoreError as e:
            log.warning("store unreadable, retrying: %s", e)
            versions = []
        if versions:
            version = versions[-1]  # the newest: a curve with gaps beats a queue that falls behind
            skipped += len(versions) - 1
            todo = modes_for(modes, sweep, args.greedy_at, version, first=done < 0, final=final)
        elif final is not None and done >= final:
            # The final version may have been scored before it was known to be the final one
            # (greedy skipped, or sampled once a task: it is scored again with --samples).
            version, todo = final, [m for m in modes if m not in scored.get(final, set())]
            if not todo:
                return rows
        else:
            time.sleep(args.poll_s)
            continue
        params = None  # the last version's, dropped before the next is read: one copy at a time
        try:
            with tracer.span("load policy", "evaluator", version=version):
                params, meta = loader.load(version)
                params = cast_params(params, dtype)  # once per version, as the engine serves it
        except StoreError as e:  # gc'ed meanwhile, or being written: try the next poll
            log.warning("cannot load version %d: %s", version, e)
            time.sleep(args.poll_s)
            continue
        # The first version scored is the run's baseline (v0): never given up.
        superseded = functools.partial(_superseded, args.stop_file, version) if done >= 0 else None
        ends = done < 0 or version == final or args.samples_at == "every"
        for task in todo:
            mode, temperature = mode_temperature(task)
            row = {
                "version": version,
                "step": meta.get("metadata", {}).get("step"),
                "mode": mode,
                "temperature": temperature,
                "published_at": meta.get("written_at"),
                "evaluated_at": time.time(),
                "skipped_versions": skipped,
            }
            samples = 1 if mode == "greedy" or not ends else args.samples  # greedy: the same episode n times
            with tracer.span("evaluate", "evaluator", version=version, mode=mode, temperature=temperature) as span:
                sampler.temperature = temperature
                try:
                    row.update(evaluate(params, sampler, *episode_args, superseded, samples))
                except Superseded:
                    log.info(
                        "eval v%d %s given up: the learner is done, and a later version is the final", version, mode
                    )
                    skipped += 1
                    break
                span.args["success"] = row["success"]
            write_examples(out, row)
            rows.append(row)
            if samples == args.samples or mode == "greedy":
                scored.setdefault(version, set()).add(task)
            heap.release()  # an evaluation's freed episode state, kept by glibc otherwise
            # Step: the learner step that published the version, so eval/ lines up with losses/.
            memory = process_memory.sample({"mem/compiled_variants": sampler.compiled_variants()})
            writer.write(row["step"] if row["step"] is not None else version, {**eval_scalars(row), **memory})
            if writer.local_dir is not None:  # with AGENTIC_RL_TRACEMALLOC: what grew
                process_memory.write_growth(writer.local_dir / "tracemalloc.txt")
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            passes = " ".join(f"pass@{k} {v:.3f}" for k, v in row.get("pass_at", {}).items())
            log.info(
                "eval v%d %s: success %.3f over %d tasks x %d (%.1fs) %s: %s",
                *(version, task, row["success"], row["tasks"], samples, row["eval_s"], passes),
                ", ".join(f"{k} {v}" for k, v in sorted(row["outcomes"].items())),
            )
        done = max(done, version)
    raise SystemExit(f"evaluator timed out after {args.timeout_s}s at version {done}")


def write_examples(out: Path, row: dict) -> None:
    """The row's failed episodes (popped: eval.jsonl stays one short line a row) beside `out`."""
    examples = row.pop("examples", None) or {}
    with out.with_suffix(".examples.jsonl").open("a") as f:
        for kind, episodes in sorted(examples.items()):
            for episode in episodes:  # the task's prompt and target, and the transcript
                f.write(json.dumps({"version": row["version"], "mode": row["mode"], "class": kind, **episode}) + "\n")


SWEEP = SWEEP_MODE


def sweep_temperatures(text: str) -> list[float]:
    """--temperatures as floats; 1 is left out (the sampled mode's row is that point)."""
    try:
        temps = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"--temperatures must be comma-separated numbers, got {text!r}") from None
    if any(not t > 0 for t in temps):
        raise SystemExit(f"--temperatures must all be > 0 (greedy is its own mode), got {text!r}")
    return sorted({t for t in temps if t != 1.0})


def mode_temperature(task: str) -> tuple[str, float]:
    """("sampled", 1.0), ("greedy", 0.0) or ("sweep", T) for "sweep@T"."""
    if task.startswith(f"{SWEEP}@"):
        return SWEEP, float(task.split("@", 1)[1])
    return task, 0.0 if task == "greedy" else 1.0


def modes_for(
    modes: list[str], sweep: list[float], greedy_at: str, version: int, first: bool, final: int | None
) -> list[str]:
    """What a version is scored in: the modes (greedy per --greedy_at), then, for the first
    version alone, "sweep@T" for each sweep temperature. A new list: `modes` is never changed."""
    todo = [m for m in modes if m != "greedy" or greedy_at == "every" or first or version == final]
    return todo + ([f"{SWEEP}@{t:g}" for t in sweep] if first else [])


def eval_scalars(row: dict) -> dict:
    m = row["mode"] if row["mode"] != SWEEP else f"T{row['temperature']:g}"
    out = {"eval/version": row["version"], f"eval/{m}_success": row["success"]}
    for k, v in (row.get("pass_at") or {}).items():
        out[f"eval/{m}_pass@{k}"] = v
    out["eval/skipped_versions"] = row["skipped_versions"]
    for k in ("mean_turns", "tool_calls_per_episode", "tool_error_rate", "malformed_rate", "eval_s", "sandbox_s"):
        if isinstance(row.get(k), int | float):
            out[f"eval/{m}_{k}"] = row[k]
    for outcome, count in (row.get("outcomes") or {}).items():  # shares: how episodes end
        out[f"eval/{m}_outcome_{outcome}"] = count / max(row["n"], 1)
    return out


def _exit_on_signal(signum, _frame):
    raise SystemExit(128 + signum)  # run()'s finally closes the scalar files and the trace


def main(argv=None) -> int:
    heap.limit_arenas(2)  # before JAX's threads: fewer arenas, less fragmentation (core/heap.py)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    # force: absl (imported by orbax and tfds) installs a root handler first, which would
    # swallow our lines.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
