"""The capacity plan for production hardware: `python -m localstack.launch.scale_plan
--model qwen2.5-0.5b --accelerator v5e-8 --rollout_accelerator l4 --tool_latency_s 2`.

From a model (a named size or an HF config.json), the vendors' accelerator figures
(`localstack.launch.accelerators`), an episode's shape and tool latency, and the batch, it
predicts the learner's step time, one rollout worker's trajectories/s, the workers and
trajectories in flight that keep the learner at --target_duty, the staleness that follows,
what binds, and the Vertex AI and Dataflow settings that ask for it. The arithmetic is in
`localstack.launch.scale_model`; the Little's-law part is `trainer.learning.capacity`, the
planner the local stack measures with (`localstack.launch.plan`).

Measured figures replace predicted ones where given: --learner_step_s, --worker_rate,
--episode_s, --trajectories_per_record; --measured reads them all from a
benchmarks/utilization.py JSON (docs/results/utilization.json: this machine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from core import config
from core.config import configclass, knob
from core.policy.formats.hf_config import config_from_hf, read_hf_config
from core.policy.formats.hf_presets import PRESETS, preset_config
from core.policy.model.config import MODEL_CONFIGS
from environments.latency import LatencyModel
from localstack.launch import scale_model as sm
from localstack.launch.accelerators import parse_slice
from trainer.learning.data.feeder import CreditConfig, CreditWindow
from trainer.learning.step.learner import LearnerConfig

MODEL_HELP = f"a preset ({', '.join([*PRESETS, *MODEL_CONFIGS])}), an HF checkpoint directory or its config.json"
_DEFAULT = sm.Assumptions()
MEASURED_PIPELINE_S = 2.0  # localstack.launch.plan: the packer's 1 s max wait + its 1 s transport constant


@configclass
class ScalePlanConfig:
    model: str = knob("qwen2.5-0.5b", MODEL_HELP)
    accelerator: str = knob("v5e-8", "the learner: a TPU slice (v5e-8, v5p-64, v6e-16) or GPUs (h100x8)")
    rollout_accelerator: str = knob("l4", "one rollout worker: l4, a100-40gb, a100-80gb, h100, or NxGPUs (l4x2)")
    # The episode
    tool_latency_s: float = knob(2.0, "mean seconds a tool call takes")
    tool_latency: str | None = knob(None, "a latency spec instead (fixed:S, uniform:A:B, lognormal:M:S): its mean")
    tool_calls: float = knob(3.0, "tool calls an episode makes (mean)")
    episode_tokens: float = knob(1536.0, "a trajectory's tokens: prompt with the tools block, turns, tool output")
    generated_tokens: float = knob(384.0, "of those, the tokens the policy generates")
    # The batch and the run
    batch_records: int = knob(LearnerConfig.batch_records, "records per learner step")
    rows: int = knob(4, "rows per record")
    seq_len: int = knob(2048, "row length (tokens)")
    max_segments: int = knob(16, "trajectories per row at most")
    fill: float = knob(0.9, "non-pad share of record slots the packer reaches (measured here: 0.87-0.97)")
    attention_span: int = knob(0, "keys a training query attends (banded: the trajectory length; 0: seq_len)")
    kl_reference: bool = knob(False, "a KL reference forward each step (kl_coef > 0)")
    group_size: int = knob(8, "episodes per request (the GRPO group)")
    publish_every: int = knob(LearnerConfig.publish_every, "learner steps between policy versions")
    target_duty: float = knob(0.9, "the learner duty cycle the plan aims at")
    staleness_bound: float = knob(2.0, "mean policy versions a trajectory may lag (caps the window)")
    pipeline_s: float = knob(2.0, "finished episode -> record at the learner: packer max wait + transport")
    max_workers: int = knob(0, "cap on rollout workers (0: as many as the target needs)")
    workers: int = knob(0, "a fixed pool of rollout workers (0: size it)")
    # The engine
    engine_slots: int = knob(128, "KV-cache slots a worker (its decode batch); capped by what fits")
    engine_prefill: int = knob(16, "tokens a slot is fed per catch-up call")
    engine_prefill_slots: int = knob(8, "slots fed per catch-up call")
    cache_len: int = knob(0, "the KV cache's length (0: the row length)")
    # Assumptions (printed with the plan)
    learner_mfu: float = knob(_DEFAULT.learner_mfu, "assumed MFU of the train step")
    decode_mfu: float = knob(_DEFAULT.decode_mfu, "assumed MFU of a compute-bound engine call")
    bandwidth_efficiency: float = knob(_DEFAULT.bandwidth_efficiency, "assumed share of HBM bandwidth decode reaches")
    memory_fraction: float = knob(_DEFAULT.memory_fraction, "share of HBM for weights + KV cache")
    step_overhead_s: float = knob(_DEFAULT.step_overhead_s, "host seconds an engine call (measured here)")
    host_s_per_trajectory: float = knob(_DEFAULT.host_s_per_trajectory, "Beam seconds a trajectory (measured here)")
    # Measured figures, where there are any (they replace the predictions)
    learner_step_s: float | None = knob(None, "measured learner step time")
    worker_rate: float | None = knob(None, "measured trajectories/s of one rollout worker")
    episode_s: float | None = knob(None, "measured episode wall time (generation + tools)")
    trajectories_per_record: float | None = knob(None, "measured on the stream")
    measured: str | None = knob(None, "a benchmarks/utilization.py JSON: all four from its --tool_latency row")
    out: str | None = knob(None, "write the plan here as JSON")


def parse_config(argv) -> ScalePlanConfig:
    return config.parse(ScalePlanConfig, argv, description=__doc__, prog="python -m localstack.launch.scale_plan")


def model_config(name: str):
    if name.lower() in PRESETS:
        return preset_config(name)
    if name in MODEL_CONFIGS:
        return MODEL_CONFIGS[name]
    path = Path(name)
    if path.is_file():
        return config_from_hf(json.loads(path.read_text()), source=str(path))
    if path.is_dir():
        return read_hf_config(path)
    raise ValueError(f"--model {name!r}: not {MODEL_HELP}")


def latency_mean(spec: str) -> float:
    m = LatencyModel.from_spec(spec)
    return {"none": 0.0, "fixed": m.seconds, "uniform": (m.low + m.high) / 2,
            "lognormal": m.median * pow(2.718281828459045, m.sigma**2 / 2)}[m.kind]  # fmt: skip


def measured_inputs(path: str | os.PathLike, tool_latency: str) -> dict:
    """This machine's measured rates from a benchmarks/utilization.py result, at one latency:
    the learner alone (step time), the rollout job alone (trajectories/s, packing, tokens),
    and the episode time its plan measured (oracle episodes + engine generation)."""
    doc = json.loads(Path(path).read_text())
    rows = {r["tool_latency"]: r for r in doc["latencies"]}
    if tool_latency not in rows:
        raise ValueError(f"{path}: no row for tool latency {tool_latency!r}; rows: {sorted(rows)}")
    r = rows[tool_latency]
    roll, plan = r["rollout_alone"], r["plan"]
    # The plan's credits limit is its window over its measured latency (episode + pipeline).
    latency_s = plan["max_in_flight"] / r["predicted"]["async"]["limits"]["credits"]
    return {
        "learner_step_s": r["learner_alone"]["step_s"],
        "worker_rate": roll["trajectories_per_s"],
        "trajectories_per_record": roll["trajectories_per_record"],
        "episode_tokens": roll["tokens_per_s"] / roll["trajectories_per_s"],
        "episode_s": latency_s - MEASURED_PIPELINE_S,
        "batch_records": doc["args"]["batch_records"],
        "publish_every": doc["args"]["publish_every"],
        "measured_duty": r["async"]["duty"],
        "source": f"{path} ({tool_latency}, {doc['args']['latencies']})",
    }


def run(cfg: ScalePlanConfig) -> dict:
    measured = measured_inputs(cfg.measured, cfg.tool_latency or "fixed:2") if cfg.measured else {}
    if measured:
        keep = ("learner_step_s", "worker_rate", "trajectories_per_record", "episode_tokens", "episode_s")
        keep += ("batch_records", "publish_every")
        cfg = dataclasses.replace(cfg, **{k: measured[k] for k in keep})
    mcfg = model_config(cfg.model)
    dims = sm.ModelDims.from_config(mcfg)
    learner_hw, rollout_hw = parse_slice(cfg.accelerator), parse_slice(cfg.rollout_accelerator)
    a = sm.Assumptions(cfg.learner_mfu, cfg.decode_mfu, cfg.bandwidth_efficiency, cfg.memory_fraction,
                       cfg.step_overhead_s, cfg.host_s_per_trajectory)  # fmt: skip
    latency = latency_mean(cfg.tool_latency) if cfg.tool_latency else cfg.tool_latency_s
    ep = sm.Episode(cfg.episode_tokens, min(cfg.generated_tokens, cfg.episode_tokens), cfg.tool_calls, latency)
    batch = sm.Batch(cfg.batch_records, cfg.rows, cfg.seq_len, cfg.max_segments, cfg.fill,
                     cfg.attention_span or cfg.seq_len, cfg.kl_reference)  # fmt: skip
    learner = sm.learner_step(dims, learner_hw, batch, a.learner_mfu)
    if cfg.learner_step_s:
        learner = {**learner, "predicted_step_s": learner["step_s"], "step_s": cfg.learner_step_s}
    engine = sm.Engine(cfg.engine_slots, cfg.engine_prefill, cfg.engine_prefill_slots, cfg.cache_len or cfg.seq_len)
    worker = sm.rollout_worker(dims, rollout_hw, ep, engine, a)
    shape_window = CreditWindow(
        CreditConfig(max_batches_ahead=0, group_size=cfg.group_size), cfg.batch_records, _shape(cfg)
    ).min_window
    tpr = cfg.trajectories_per_record or batch.trajectories_per_record(cfg.episode_tokens)
    result = sm.plan(
        step_s=cfg.learner_step_s or learner["step_s"],
        trajectories_per_record=tpr,
        batch_records=cfg.batch_records,
        worker_rate=cfg.worker_rate or worker.rate,
        worker_binds="rollout workers (measured rate)" if cfg.worker_rate else worker.binds,
        episode_s=cfg.episode_s or worker.episode_s,
        pipeline_s=cfg.pipeline_s,
        tokens_per_trajectory=cfg.episode_tokens,
        target_duty=cfg.target_duty,
        group_size=cfg.group_size,
        publish_every=cfg.publish_every,
        min_window=shape_window,
        staleness_bound=cfg.staleness_bound,
        max_workers=cfg.max_workers or None,
        workers=cfg.workers or None,
    )
    return {
        "config": dataclasses.asdict(cfg),
        "model": {"params": dims.params, "layers": dims.layers, "d_model": dims.d_model, "kv_heads": dims.kv_heads,
                  "head_dim": dims.head_dim, "kv_bytes_per_token": dims.kv_bytes_per_token},
        "learner_hw": {"name": learner_hw.name, "chips": learner_hw.chips, "hosts": learner_hw.hosts,
                       "chip": learner_hw.chip.name, "source": learner_hw.chip.source},
        "rollout_hw": {"name": rollout_hw.name, "chips": rollout_hw.chips, "chip": rollout_hw.chip.name,
                       "source": rollout_hw.chip.source},
        "assumptions": dataclasses.asdict(a),
        "tool_latency_mean_s": latency,
        "learner": learner,
        "worker": dataclasses.asdict(worker),
        "trajectories_per_record": tpr,
        "measured": measured,
        "plan": result,
        "cloud": cloud_flags(learner_hw, rollout_hw, result, worker, cfg),
    }  # fmt: skip


def _shape(cfg: ScalePlanConfig):
    from core.contracts.record_shape import RecordShape

    return RecordShape(cfg.rows, cfg.seq_len, cfg.max_segments)


def cloud_flags(learner_hw, rollout_hw, p: dict, worker: sm.Worker, cfg: ScalePlanConfig) -> dict:
    """The agentic-rl vertex and Dataflow flags the plan implies (docs/DEPLOY.md)."""
    v = learner_hw.vertex()
    vertex = [f"--machine_type={v['machine_type']}"]
    vertex += [f"--tpu_topology={v['tpu_topology']}"] if "tpu_topology" in v else []
    vertex += [f"--replica_count={v['replica_count']}"]
    out = {"vertex": vertex, "learner": p["learner_flags"]}
    try:
        d = rollout_hw.dataflow()
    except ValueError as e:
        out["dataflow"] = [f"# {e}"]
        return out
    n = p["workers"]
    out["dataflow"] = [
        f"--machine_type={d['machine_type']}",
        f"--dataflow_service_options={d['dataflow_service_options']}",
        "--number_of_worker_harness_threads=4",
        f"--engine_slots={worker.slots}",
        f"--engine_prefill={cfg.engine_prefill}",
        f"--engine_prefill_slots={cfg.engine_prefill_slots}",
        f"--max_concurrent_groups={p['max_concurrent_groups']}",
        f"--num_workers={n}",
        "--autoscaling_algorithm=THROUGHPUT_BASED",
        f"--max_num_workers={max(n, cfg.max_workers or 0, -(-n * 5 // 4))}",
    ]
    return out


def _fmt(x: float, unit: str = "") -> str:
    for scale, suffix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {suffix}{unit}"
    return f"{x:.3g} {unit}".rstrip()


def table(r: dict) -> list[str]:
    c, m, lh, rh, a = r["config"], r["model"], r["learner_hw"], r["rollout_hw"], r["assumptions"]
    ln, w, p, meas = r["learner"], r["worker"], r["plan"], r["measured"]

    def src(key):
        return "measured" if (meas and key in meas) or c.get(key) else "predicted"

    slots = c["batch_records"] * c["rows"] * c["seq_len"]
    learner_hw = f"{lh['name']}: {lh['chips']} x {lh['chip']} on {lh['hosts']} host(s) [vendor: {lh['source']}]"
    rollout_hw = f"{rh['name']}: {rh['chips']} x {rh['chip']} [vendor: {rh['source']}]"
    engine = (
        f"; engine: {w['slots']} slots (fit {w['max_slots']}), decode step {w['decode_step_s'] * 1e3:.1f} ms, "
        f"{w['decode_tokens_per_s']:,.0f} tok/s, prefill call {w['prefill_step_s'] * 1e3:.1f} ms, "
        f"{'refeed' if w['refeed'] else 'slots held'} on tool calls; bound by {w['binds']}"
    )
    fix = f" (at bound {c['staleness_bound']} the target needs --publish_every >= {p['min_publish_every']})"
    rows = [
        ("model", f"{c['model']}: {_fmt(m['params'])} params, {m['layers']} layers, d_model {m['d_model']}, "
                  f"{m['kv_heads']} KV heads x {m['head_dim']}, KV {_fmt(m['kv_bytes_per_token'], 'B')}/token"),
        ("learner hardware", "this machine, measured (one core)" if meas else learner_hw),
        ("rollout worker", "this machine, measured (the Beam job on the other core)" if meas else rollout_hw),
        ("assumptions", f"learner MFU {a['learner_mfu']}, decode MFU {a['decode_mfu']}, bandwidth efficiency "
                        f"{a['bandwidth_efficiency']}, HBM share {a['memory_fraction']}; host "
                        f"{a['step_overhead_s'] * 1e3:.1f} ms/call, {a['host_s_per_trajectory'] * 1e3:.1f} "
                        "ms/trajectory (measured here)"),
        ("episode", f"{c['episode_tokens']:.0f} tokens ({min(c['generated_tokens'], c['episode_tokens']):.0f} "
                    f"generated), {c['tool_calls']:g} tool calls x {r['tool_latency_mean_s']:.2f} s"),
        ("batch", f"{c['batch_records']} records x {c['rows']} rows x {c['seq_len']} = {slots:,} slots, fill "
                  f"{c['fill']}, {r['trajectories_per_record']:.1f} trajectories/record"),
        ("learner step", f"{ln['step_s']:.3g} s ({src('learner_step_s')}; {_fmt(ln['flops'], 'FLOP')}: 6N "
                         f"{_fmt(ln['flops_weights'])}, KL ref {_fmt(ln['flops_reference'])}); train state "
                         f"{_fmt(ln['train_state_bytes'], 'B')} of {_fmt(ln['hbm_bytes'], 'B')} HBM"),
        ("learner rate", f"{p['learner_rate']:.1f} trajectories/s at duty 1 ({p['trajectories_per_step']:.0f} a step)"),
        ("rollout worker rate", f"{(c['worker_rate'] or w['rate']):.2f} trajectories/s ({src('worker_rate')})"
                                + ("" if c["worker_rate"] else engine)),
        ("episode time", f"{(c['episode_s'] or w['episode_s']):.2f} s ({src('episode_s')}) + "
                         f"{c['pipeline_s']} s pipeline"),
        ("rollout workers", f"{p['workers']} (target needs {p['workers_needed']})"),
        ("in flight", f"{p['max_in_flight']} trajectories (target needs {p['required_in_flight']}); "
                      f"{p['max_concurrent_groups']} groups of {c['group_size']} a worker"),
        ("staleness", f"{p['staleness_versions']:.2f} versions mean (bound {c['staleness_bound']}), "
                      f"--max_staleness {p['max_staleness']}"),
        ("learner duty", f"{p['duty']:.2f} (target {c['target_duty']}; sync baseline {p['sync_duty']:.2f})"),
        ("binds", p["binds"] + (fix if "staleness" in p["binds"] else "")),
        ("trained tokens/s", f"{p['trained_tokens_per_s']:,.0f}"),
        ("request backlog", f"{p['backlog_requests']:.1f} requests (~{p['backlog_s']:.1f} s of rollout work)"),
    ]  # fmt: skip
    if meas:
        rows.append(("measured duty", f"{meas['measured_duty']:.3f} [{meas['source']}]"))
    width = max(len(k) for k, _ in rows)
    lines = [f"| {'':{width}} | plan |", f"|{'-' * (width + 2)}|------|"]
    lines += [f"| {k:{width}} | {v} |" for k, v in rows]
    cl = r["cloud"]
    if meas:
        return [*lines, "", "learner: " + " ".join(cl["learner"])]
    lines += ["", "Vertex AI (agentic-rl vertex): " + " ".join(cl["vertex"]), "learner: " + " ".join(cl["learner"])]
    lines += ["Dataflow (agentic-rl rollout): " + " ".join(cl["dataflow"])]
    return lines


def main(argv=None) -> int:
    cfg = parse_config(argv)
    result = run(cfg)
    print("\n".join(table(result)))
    if cfg.out:
        Path(cfg.out).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
