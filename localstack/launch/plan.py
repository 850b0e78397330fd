"""The capacity planner: `python -m localstack.launch.plan --env calculator --tool_latency fixed:2`.

A latency audit before a run. It measures, on this machine:
- the environment: oracle episodes through the real environment and its latency model
  (tool calls and tool wait per episode, the slowest episode of a synchronous round);
- the rollout engine: decode step time with every slot busy, hence generation time per
  episode and an engine-only ceiling of episodes/s (an upper bound: no host work in it);
- the rollout rate: whole groups of real episodes through a worker's engine and episode
  loop, tools included (localstack/launch/plan_rollout.py); Beam's own cost is not in it:
  pass the rollout side's measured ceiling with --rollout_rate, as benchmarks/utilization.py does;
- the learner: its step time on records packed from those transcripts by the real packer,
  hence trajectories per record and fill.
Then `trainer.learning.capacity` applies Little's law and says what binds; the plan is
written as JSON whose `learner_flags` and `pipeline_flags` the demo passes on.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

import environments
from core import config
from core.config import configclass, knob, knob_like, section
from core.contracts.record_shape import LayoutConfig
from core.policy.model.lora import LoraConfig
from core.policy.sources import policy_spec
from core.policy.text.chat_format import ChatFormat, chat_format_for
from core.sections import EnvChoice, ModelChoice
from localstack.launch.plan_rollout import measure_rollout
from localstack.launch.staleness_evidence import default_bound
from pipelines.packing_config import PackingConfig
from rollout.engine_config import EngineConfig
from trainer.config import LearnerJobConfig
from trainer.learning.capacity import Measurements, make_plan
from trainer.learning.data.feeder import CreditConfig, CreditWindow
from trainer.learning.step.gradients import ComputeConfig
from trainer.learning.step.learner import LearnerConfig

# The rollout job's knobs that no episode of the planner's reads.
ENGINE_PLUMBING = (
    "queued_groups",
    "admit_poll_s",
    "commit_interval_s",
    "request_shards",
    "policy_poll_s",
    "policy_wait_s",
    "telemetry_every_s",
)
DEFAULT_PIPELINE_S = 1.0  # request publish + bundle + commit + record publish + poll (docs/BENCHMARKS.md)


@configclass
class PlanConfig:
    """The planner's flags. The knobs it shares with the learner and the rollout job take
    their defaults from those jobs' configs, so a plan sizes the run they would start."""

    env: EnvChoice = section(lambda: EnvChoice(tool_latency="fixed:0.5"), help="the environment measured")
    episodes: int = knob(64, "oracle episodes measured")
    batch_records: int = knob_like(LearnerConfig, "batch_records")
    group_size: int = knob_like(CreditConfig, "group_size")
    publish_every: int = knob_like(LearnerConfig, "publish_every")
    target_duty: float = knob(0.95, "the learner duty cycle the plan aims at")
    staleness_bound: float | None = knob(
        None,
        "mean policy versions a trajectory may lag (caps credits); unset: the bound the staleness sweep "
        "found fastest to target at this tool latency (localstack/launch/staleness_evidence.py), else 2",
        gt=0,
    )
    max_wait_s: float = knob_like(PackingConfig, "max_wait_s")  # adds to the latency
    pipeline_s: float | None = knob(None, "transport latency (unset: a measured constant)")
    rollout_rate: float | None = knob(None, "measured rollout ceiling, trajectories/s (unset: measured here)")
    rollout_measure_s: float = knob(
        20.0, "seconds of whole groups of episodes timed for the rollout rate (0: the engine-only ceiling)", ge=0
    )
    init_policy: str | None = knob_like(LearnerJobConfig, "init_policy")  # the episodes' policy too
    workers: int = knob(1, "rollout workers (0: size the pool)")
    # Measured elsewhere, on the real stream (benchmarks/utilization.py passes its ceilings'):
    learner_step_s: float | None = knob(None, "measured learner step time")
    trajectories_per_record: float | None = knob(None, "measured on the real stream")
    tokens_per_trajectory: float | None = knob(None, "measured on the real stream")
    learner_steps: int = knob(5, "timed learner steps")
    model: ModelChoice = section(ModelChoice, help="the policy model (the learner's)", shared=True)
    engine: EngineConfig = section(  # the settings its episodes depend on are flags; the job's plumbing is not
        EngineConfig,
        help="a rollout worker's engine and episodes (the rollout job's)",
        hide=(*ENGINE_PLUMBING, "logdir", "trace_dir"),
    )
    out: str | None = knob(None, "write the plan here as JSON")
    layout: LayoutConfig = section(LayoutConfig, help="the record layout, the same on both sides")
    compute: ComputeConfig = section(ComputeConfig, help="the learner step's memory settings (the learner's)")
    lora: LoraConfig = section(LoraConfig, "lora_", "LoRA adapters of the learner's step (rank 0: full fine-tuning)")


def parse_config(argv) -> PlanConfig:
    return config.parse(PlanConfig, argv, description=__doc__, prog="agentic-rl plan")


# ----------------------------------------------------------------------------- environment
async def _oracle_episode(env, oracle, task, fmt: ChatFormat, max_turns: int = 8) -> dict:
    """One oracle episode through the real environment (its latency model included), its
    tokens counted in the model's chat format."""
    t0 = time.monotonic()
    tools = env.tools()
    prompt_tokens = len(fmt.prompt_ids(await env.reset(task), tools))
    generated, observed, observations, info = 0, 0, [], {}
    for _ in range(max_turns):
        action = oracle(task, observations)
        generated += len(fmt.action_ids(action, tools))
        result = await env.step(action)
        info = result.info
        if result.done:
            break
        observed += len(fmt.observation_ids(result.observation))
        observations.append(result.observation)
    return {
        "wall_s": time.monotonic() - t0,
        "tool_calls": info.get("tool_calls", 0),
        "turns": info.get("turns", 0),
        "tokens": prompt_tokens + generated + observed,
        "generated": generated,
    }


def measure_environment(
    env_name: str, tool_latency: str, n: int, fmt: ChatFormat, env_config: dict | None = None
) -> dict:
    """n oracle episodes at once (as the engine runs them): per-episode means, and the
    latency model's own draws for the slowest episode of a round."""
    settings = {**(env_config or {}), "tool_latency": tool_latency}
    tasks = environments.make_tasks(env_name, 1, n, "train", settings)
    oracle = environments.oracle(env_name)

    async def run_all():
        return await asyncio.gather(
            *(_oracle_episode(environments.make(env_name, **settings), oracle, t, fmt) for t in tasks)
        )

    rows = asyncio.run(run_all())
    return {
        "episodes": n,
        "episode_wall_s": statistics.fmean(r["wall_s"] for r in rows),
        "slowest_episode_s": max(r["wall_s"] for r in rows),
        "tool_calls_per_episode": statistics.fmean(r["tool_calls"] for r in rows),
        "turns_per_episode": statistics.fmean(r["turns"] for r in rows),
        "tokens_per_trajectory": statistics.fmean(r["tokens"] for r in rows),
        "generated_per_episode": statistics.fmean(r["generated"] for r in rows),
        "lengths": [r["tokens"] for r in rows],
    }


# ----------------------------------------------------------------------------- engine
def measure_engine(slots: int, max_tokens: int, cfg, new_tokens: int = 48) -> dict:
    """Every slot busy decoding: the step time an episode's tokens are paid in."""
    from core.policy.model.transformer import init_model, split_params
    from core.policy.sampling.sampler import Sampler
    from rollout.engine import InferenceEngine, Sequence

    _, params = split_params(init_model(cfg, 0))
    sampler = Sampler(cfg, slots=slots, length=max_tokens)
    sampler.warmup(params)
    engine = InferenceEngine(sampler, lambda: (params, 0))

    async def one(i):
        seq = Sequence.start([32 + (i + j) % 90 for j in range(9)])
        await engine.generate(seq, new_tokens, lambda _g: False)
        engine.release(seq)

    async def all_slots():
        await asyncio.gather(*(one(i) for i in range(slots)))

    t0 = time.perf_counter()
    asyncio.run(all_slots())
    wall = time.perf_counter() - t0
    return {
        "slots": slots,
        "step_s": engine.stats["busy_s"] / max(1, engine.stats["steps"]),
        "tokens_per_s": engine.stats["generated_tokens"] / wall,
    }


# ----------------------------------------------------------------------------- learner
def synthetic_trajectory(request_id: str, i: int, n: int, finished_at: float = 0.0):
    """Sample i of a request: n tokens, the first third prompt, then policy tokens with
    alternating reward (the lengths are what packing and the learner's cost depend on)."""
    from core.contracts.trajectory import Trajectory

    mask = np.zeros(n, np.uint8)
    mask[n // 3 :] = 1
    return Trajectory(
        trajectory_id=f"{request_id}/{i}",
        request_id=request_id,
        task_id="synthetic",
        tokens=(np.arange(n) % 200 + 3).astype(np.int32),
        loss_mask=mask,
        behaviour_logprobs=np.where(mask == 1, -1.0, 0.0).astype(np.float32),
        policy_versions=np.where(mask == 1, 0, -1).astype(np.int32),
        reward=float(i % 2),
        status="finished",
        advantage=0.5 if i % 2 else -0.5,
        finished_at=finished_at,
    )


def measure_learner(
    layout,
    batch_records: int,
    lengths: list[int],
    steps: int,
    cfg,
    banded: bool = True,
    compute: ComputeConfig | None = None,
    lora: LoraConfig | None = None,
) -> dict:
    """The packer's records for these lengths, and the learner's step on them (banded: as the
    job's learner, attention within a trajectory's span; else dense over the row), with the
    learner's memory settings and LoRA: the step the run will take, refused before it runs
    if it cannot fit (trainer/learning/step/memory.py)."""
    from pipelines.packing import pack
    from trainer.learning.step.learner import Learner

    shape = layout.largest
    need = batch_records * shape.max_trajectories * 2
    trajs = [
        synthetic_trajectory(f"plan-{i // 8}", i % 8, min(lengths[i % len(lengths)], layout.trajectory_len))
        for i in range(need)
    ]
    packed = pack(trajs, shape)
    records = packed[:-1] or packed  # the last one is the part-full remainder
    fill = statistics.fmean(r.num_tokens / (shape.rows * shape.seq_len) for r in records)
    per_record = statistics.fmean(len(r.trajectories) for r in records)
    span = layout.trajectory_len if banded else None  # as builder.make_learner
    lcfg = LearnerConfig(batch_records=batch_records, compute=compute or ComputeConfig(), lora=lora or LoraConfig())
    learner = Learner(cfg, lcfg, span=span)
    batch = [records[i % len(records)] for i in range(batch_records)]
    learner.train_step(batch)  # compile
    times = []
    # Up to `steps` steps, but no more than a minute of them: a real model's step takes minutes.
    while len(times) < steps and (not times or sum(times) < 60):
        t0 = time.perf_counter()
        learner.train_step(batch)
        times.append(time.perf_counter() - t0)
    return {
        "step_s": statistics.median(times),
        "trajectories_per_record": per_record,
        "fill": fill,
        "tokens_per_record": statistics.fmean(r.num_tokens for r in records),
    }


# ----------------------------------------------------------------------------- plan
def run(cfg: PlanConfig) -> dict:
    layout = cfg.layout.layout
    spec, latency = policy_spec(cfg.model.checkpoint, cfg.model.builtin), cfg.env.tool_latency or "none"
    env = measure_environment(cfg.env.name, latency, cfg.episodes, chat_format_for(spec.tokenizer), cfg.env.config)
    engine = measure_engine(cfg.engine.slots, layout.trajectory_len, spec.cfg)
    rollout = None
    if cfg.rollout_rate is None and cfg.rollout_measure_s > 0:
        rollout = measure_rollout(
            spec, cfg.engine, cfg.env, cfg.group_size, layout.trajectory_len, cfg.rollout_measure_s, cfg.init_policy
        )
    lengths = env.pop("lengths")
    learner = measure_learner(
        layout, cfg.batch_records, lengths, cfg.learner_steps, spec.cfg, compute=cfg.compute, lora=cfg.lora
    )
    generation_s = env["generated_per_episode"] * engine["step_s"]
    engine_rate = engine["tokens_per_s"] / env["generated_per_episode"]
    m = Measurements(
        step_s=cfg.learner_step_s or learner["step_s"],
        trajectories_per_record=cfg.trajectories_per_record or learner["trajectories_per_record"],
        batch_records=cfg.batch_records,
        episode_s=env["episode_wall_s"] + generation_s,
        pipeline_s=cfg.max_wait_s + (DEFAULT_PIPELINE_S if cfg.pipeline_s is None else cfg.pipeline_s),
        rollout_rate=cfg.rollout_rate or (rollout and rollout["trajectories_per_s"]) or engine_rate,
        tokens_per_trajectory=cfg.tokens_per_trajectory or env["tokens_per_trajectory"],
        slowest_episode_s=env["slowest_episode_s"] + generation_s,
    )
    credits = CreditWindow(
        CreditConfig(max_batches_ahead=0, group_size=cfg.group_size), cfg.batch_records, layout.largest
    )
    if cfg.staleness_bound is None:
        bound, bound_why = default_bound(latency)
    else:
        bound, bound_why = cfg.staleness_bound, f"bound {cfg.staleness_bound:g}: given (--staleness_bound)"
    plan = make_plan(
        m,
        target_duty=cfg.target_duty,
        group_size=cfg.group_size,
        publish_every=cfg.publish_every,
        min_window=credits.min_window,
        workers=cfg.workers or None,
        staleness_bound=bound,
    )
    return {
        "env": cfg.env.name,
        "tool_latency": latency,
        "rollout_rate_source": _rate_source(cfg, rollout),
        "engine_only_rate": engine_rate,
        "measured": {"environment": env, "engine": engine, "rollout": rollout, "learner": learner},
        "measurements": m.__dict__,
        "learner_rate": m.learner_rate,
        "latency_s": m.latency_s,
        "plan": {
            "target_duty": plan.target_duty,
            "staleness_bound": bound,
            "staleness_bound_why": bound_why,
            "max_in_flight": plan.max_in_flight,
            "max_staleness": plan.max_staleness,
            "rollout_workers": plan.rollout_workers,
            "max_concurrent_groups": plan.max_concurrent_groups,
            "engine_slots": plan.engine_slots,
            "sync_round_trajectories": plan.sync_round_trajectories,
        },
        "predicted": {"async": plan.async_prediction.__dict__, "sync": plan.sync_prediction.__dict__},
        "learner_flags": plan.learner_flags(),
        "pipeline_flags": plan.pipeline_flags(),
    }


def _rate_source(cfg: PlanConfig, rollout: dict | None) -> str:
    if cfg.rollout_rate:
        return "given (--rollout_rate)"
    if rollout and rollout["trajectories_per_s"] > 0:
        return f"episodes ({rollout['policy']}, {rollout['groups']} groups)"
    return "engine only (upper bound)"


def describe(r: dict) -> list[str]:
    m, p, a, s = r["measurements"], r["plan"], r["predicted"]["async"], r["predicted"]["sync"]
    return [
        f"environment {r['env']} at {r['tool_latency']}: episode {m['episode_s']:.2f} s, "
        f"+{m['pipeline_s']:.2f} s to the learner, {m['tokens_per_trajectory']:.0f} tokens",
        f"learner: {m['step_s'] * 1000:.0f} ms/step, {m['trajectories_per_record']:.2f} trajectories/record "
        f"(fill {r['measured']['learner']['fill']:.1%}) -> {r['learner_rate']:.1f} trajectories/s at duty 1",
        f"rollout: {m['rollout_rate']:.1f} trajectories/s per worker ({r['rollout_rate_source']}"
        + (f"; engine only {r['engine_only_rate']:.1f})" if "engine_only_rate" in r else ")"),  # older plans lack it
        f"plan: {p['max_in_flight']} trajectories in flight, staleness bound {p['max_staleness']}, "
        f"{p['rollout_workers']} worker(s) x {p['max_concurrent_groups']} groups, {p['engine_slots']} slots",
        f"staleness: {p.get('staleness_bound_why', p['staleness_bound'])}",
        f"async: duty {a['duty_cycle']:.2f}, bound by {a['binds']}; limits: "
        + ", ".join(f"{k} {v:.1f}/s" for k, v in a["limits"].items()),
        f"sync: duty {s['duty_cycle']:.2f} (collect {s['limits']['collect_s']:.2f} s, train "
        f"{s['limits']['train_s']:.2f} s per round of {p['sync_round_trajectories']})",
    ]


def main(argv=None) -> int:
    cfg = parse_config(argv)
    result = run(cfg)
    for line in describe(result):
        print(line)
    if cfg.out:
        with open(cfg.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
