"""The planner's rollout rate, measured as a rollout worker runs episodes.

An engine-only ceiling (every slot decoding, `plan.measure_engine`) counts tokens, not
episodes. The host work of each turn never shows in it: rendering the chat, parsing a call,
the environment's step, a group's bookkeeping. On the calculator it planned 249
trajectories/s where the rollout job ran 29 (docs/BENCHMARKS.md, issue 56).

Here the worker's own parts run whole groups: its sampler and engine, `run_group` with the
real environment at its tool latency, as many groups at once as the job admits
(`--max_concurrent_groups`). The policy is one the run would serve: a policy store's newest
version when given (the demo's `--init_policy`), else the model's initial weights (the
built-in policy's random ones, a checkpoint's own). The rate is counted while the engine
is full, from the first group's end until the last admission.

Still left out: Beam's bundles and commits, dedup and packing; and that a policy's episodes
change as it learns (the turns, calls and tokens per episode are reported beside the rate,
with the oracle's from `plan.measure_environment`).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time

import environments
from core.policy.sources import PolicySpec
from core.sections import EnvChoice
from rollout.engine_config import EngineConfig


def measure_rollout(
    spec: PolicySpec,
    engine_cfg: EngineConfig,
    env: EnvChoice,
    group_size: int,
    max_tokens: int,
    measure_s: float,
    policy_root: str | None = None,
    max_s: float = 600.0,
) -> dict:
    """Trajectories/s of whole groups through a worker's engine, measured over `measure_s`
    seconds once the first group has ended (given up after `max_s` without two ends)."""
    from core.policy.sampling.sampler import cast_params
    from core.policy.text.chat_format import chat_format_for
    from rollout.engine import InferenceEngine

    sampler, dtype = engine_cfg.make_sampler(spec.cfg, max_tokens)
    params, policy = _policy(spec, sampler, policy_root)
    params = cast_params(params, dtype)  # as a worker serves them
    sampler.warmup(params)
    engine = InferenceEngine(
        sampler,
        lambda: (params, 0),
        max_tokens,
        chat_format_for(spec.tokenizer),
        share_prompts=not engine_cfg.separate_prompts,
    )
    tasks = environments.make_tasks(env.name, 11, 512, "train", env.settings)
    ends = asyncio.run(_groups(engine, engine_cfg, env, tasks, group_size, max_tokens, measure_s, max_s))
    return {**_summary(ends, group_size), "policy": policy, "slots": engine_cfg.slots}


async def _groups(engine, engine_cfg, env, tasks, group_size, max_tokens, measure_s, max_s) -> list:
    """(end time, trajectories) of each group that ended before admissions stopped; the
    first entry is (the start, [])."""
    from rollout.episodes import run_group

    limits = engine_cfg.limits(max_tokens)
    room = asyncio.Semaphore(engine_cfg.max_concurrent_groups)
    t0 = time.monotonic()
    ends: list = [(t0, [])]

    async def group(i, task):
        try:
            envs = [environments.make(env.name, **env.settings) for _ in range(group_size)]
            trajectories = await run_group(engine, envs, task, f"plan-{i}", limits, engine_cfg.advantage_estimator)
            ends.append((time.monotonic(), trajectories))
        finally:
            room.release()

    def done(now: float) -> bool:
        first = ends[1][0] if len(ends) > 1 else None
        measured = first is not None and now - first >= measure_s and len(ends) >= 3
        return measured or now - t0 >= max_s

    running = []
    for i, task in enumerate(itertools.cycle(tasks)):
        await room.acquire()
        if done(time.monotonic()):
            break
        running.append(asyncio.create_task(group(i, task)))
    for task in running:  # the groups still running are not counted: the engine was full until now
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    ends.append((time.monotonic(), None))  # when admissions stopped
    return ends


def _summary(ends: list, group_size: int) -> dict:
    """The rate between the first group's end and the stop, and what the episodes were like."""
    stop = ends[-1][0]
    finished = [(t, trajs) for t, trajs in ends[1:-1]]
    if len(finished) < 2:
        window, counted = stop - ends[0][0], [traj for _, trajs in finished for traj in trajs]
    else:
        window, counted = stop - finished[0][0], [traj for _, trajs in finished[1:] for traj in trajs]
    every = [traj for _, trajs in finished for traj in trajs]
    mean = lambda f: statistics.fmean(f(t) for t in every) if every else 0.0
    return {
        "trajectories_per_s": len(counted) / window if window > 0 else 0.0,
        "window_s": round(window, 2),
        "groups": len(finished),
        "group_size": group_size,
        "turns_per_episode": mean(lambda t: t.num_turns),
        "tokens_per_episode": mean(lambda t: len(t.tokens)),
        "generated_per_episode": mean(lambda t: int(t.loss_mask.sum())),
        "tool_wait_s_per_episode": mean(lambda t: t.tool_wait_s),
        "reward": mean(lambda t: t.reward),
    }


def _policy(spec: PolicySpec, sampler, policy_root: str | None):
    """(params the sampler serves, what they are): a store's newest version, else the
    initial weights (a checkpoint's own, or the built-in policy's seed-0 random ones)."""
    from flax import nnx

    from core.contracts.store import PolicyStore
    from core.policy.versions import VersionLoader, base_params

    if policy_root:
        store = PolicyStore(policy_root)
        version = store.latest_version()
        if version is None:
            raise ValueError(f"--policy_root {policy_root}: no policy version to measure with")
        loader = VersionLoader(store, spec.cfg, sampler.abstract_params, base_params(spec.checkpoint))
        state, _ = loader.load(version)
        return state, f"{policy_root} v{version}"
    if spec.checkpoint:
        from core.policy.formats.hf_weights import load_checkpoint

        _, model = load_checkpoint(spec.checkpoint)
        return nnx.state(model, nnx.Param), f"{spec.checkpoint} (its own weights)"
    from core.policy.model.transformer import init_model, split_params

    _, params = split_params(init_model(spec.cfg, 0))
    return params, "initial (random, seed 0)"
