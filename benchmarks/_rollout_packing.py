"""Sections 3 and 4 of benchmarks/rollout.py: packing fill and flush latency."""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rollout/, not rollout.py

import numpy as np
from _envs import oracle_lengths
from _report import print_table

from core.contracts.record_shape import RecordShape

LENGTH = 256  # record row length = the sampler KV length in benchmarks/rollout.py


# ----------------------------------------------------------------------------- 3. packing
def length_pools(n_per_env: int) -> dict[str, list[int]]:
    t0 = time.perf_counter()
    pools = {}
    for env in ("calculator", "code", "guess"):
        try:
            pools[env] = oracle_lengths(env, n_per_env)
        except Exception as e:
            print(f"[packing] no {env} transcripts: {type(e).__name__}: {e}")
    print(
        "[packing] oracle transcripts: "
        + ", ".join(f"{k}: n={len(v)} min={min(v)} median={int(np.median(v))} max={max(v)}" for k, v in pools.items())
        + f" ({time.perf_counter() - t0:.1f} s)"
    )
    return pools


def _traj(tid: str, n: int):
    from core.contracts.trajectory import Trajectory

    mask = np.zeros(n, np.uint8)
    mask[n // 3 :] = 1
    return Trajectory(
        trajectory_id=tid,
        request_id=tid.split("/")[0],
        task_id="bench",
        tokens=(np.arange(n) % 256).astype(np.int32),
        loss_mask=mask,
        behaviour_logprobs=np.where(mask == 1, -1.0, 0.0).astype(np.float32),
        policy_versions=np.where(mask == 1, 0, -1).astype(np.int32),
        reward=0.0,
        status="finished",
        advantage=0.5,
    )


def sample_stream(
    pools: dict[str, list[int]], envs: tuple[str, ...], n: int, group: int, seed: int, max_len: int
) -> list[int]:
    """Lengths in arrival order: groups of `group` trajectories of one env (chosen per
    group), each an independent draw from that env's oracle lengths, cut to max_len as
    FitToBuckets(overlong="truncate") does."""
    rng = random.Random(seed)
    envs = tuple(e for e in envs if e in pools)
    out = []
    while len(out) < n:
        pool = pools[rng.choice(envs)]
        out += [min(rng.choice(pool), max_len) for _ in range(group)]
    return out[:n]


def stream_pack(
    lengths: list[int],
    shape: RecordShape,
    rate: float,
    max_wait_s: float | None,
    rearm: bool = False,
    extra_rows: int = 0,
) -> dict:
    """The packer's logic on a stream arriving at `rate` trajectories/s (simulated clock),
    as PackRecordsFn does it: after each arrival take_full_records; a max-wait flush packs
    the whole buffer max_wait_s after the first trajectory entered an EMPTY buffer (the
    timer is not re-armed when full records leave and some trajectories stay); a final
    flush packs what is left. Two simulated alternatives (not in pipelines/ today):
    rearm=True restarts the max-wait clock at the oldest trajectory still buffered after a
    full record leaves; extra_rows > 0 keeps that many extra rows buffered before emitting."""
    from pipelines.packing import build_record, first_fit_decreasing, pack, take_full_records

    buffer, first, arrived = [], None, {}
    emitted = {"full": [], "max_wait": [], "final": []}

    def take(buf):
        if extra_rows == 0:
            return take_full_records(buf, shape)
        ready = []
        while True:
            rows = first_fit_decreasing(
                [len(t) for t in buf], shape.seq_len, shape.max_segments_per_row, [t.trajectory_id for t in buf]
            )
            if len(rows) <= shape.rows + extra_rows:
                return ready, buf
            ready.append(build_record(buf, rows[: shape.rows], shape))
            used = {i for r in rows[: shape.rows] for i in r}
            buf = [t for i, t in enumerate(buf) if i not in used]

    for i, n in enumerate(lengths):
        now = i / rate
        if max_wait_s is not None and first is not None and now >= first + max_wait_s:
            emitted["max_wait"] += pack(buffer, shape)
            buffer, first = [], None
        t = _traj(f"g{i // 4:06d}/{i % 4}", n)
        arrived[t.trajectory_id] = now
        buffer.append(t)
        if first is None:
            first = now
        ready, buffer = take(buffer)
        emitted["full"] += ready
        if not buffer:
            first = None
        elif ready and rearm:
            first = min(arrived[b.trajectory_id] for b in buffer)
    if buffer:
        emitted["final"] += pack(buffer, shape)
    cells = shape.rows * shape.seq_len

    def fill(recs):
        return sum(r.num_tokens for r in recs) / (len(recs) * cells) if recs else None

    allrecs = [r for v in emitted.values() for r in v]
    assert sum(len(r.trajectories) for r in allrecs) == len(lengths)
    return {
        "records": len(allrecs),
        "full": len(emitted["full"]),
        "max_wait": len(emitted["max_wait"]),
        "final": len(emitted["final"]),
        "fill_full": fill(emitted["full"]),
        "fill_stream": fill(emitted["full"] + emitted["max_wait"]),
        "fill_all": fill(allrecs),
        "per_row": len(lengths) / (len(allrecs) * shape.rows),
    }


PACK_SHAPES = (
    RecordShape(4, 256, 2),
    RecordShape(4, 256, 4),  # the default since the utilization work
    RecordShape(8, 256, 2),
    RecordShape(8, 256, 8),
    RecordShape(16, 256, 8),
    RecordShape(8, 512, 8),
    RecordShape(4, 1024, 16),
)


def bench_packing(args, pools: dict[str, list[int]]) -> None:
    waits = args.pack_waits
    policies = [("final flush only", None, False, 0)]
    for x in waits:
        policies += [
            (f"max-wait {x:g} s (as implemented)", x, False, 0),
            (f"max-wait {x:g} s, re-armed (sim)", x, True, 0),
        ]
    policies.append((f"max-wait {waits[-1]:g} s, re-armed, +1 record buffered (sim)", waits[-1], True, -1))
    short = [
        policies[0],
        (f"max-wait {waits[0]:g} s (as implemented)", waits[0], False, 0),
        (f"max-wait {waits[-1]:g} s, re-armed (sim)", waits[-1], True, 0),
    ]
    for mix, envs, pols in (
        ("calc+code", ("calculator", "code"), policies),
        ("calc+code+guess", ("calculator", "code", "guess"), short),
    ):
        if not all(e in pools for e in envs):
            continue
        lengths = sample_stream(pools, envs, args.packing_n, 4, seed=1, max_len=LENGTH)
        rows = []
        for shape in PACK_SHAPES:
            for label, wait, rearm, extra in pols:
                r = stream_pack(lengths, shape, args.traj_rate, wait, rearm, shape.rows if extra < 0 else extra)
                rows.append(
                    [
                        f"{shape.rows}x{shape.seq_len}",
                        shape.max_segments_per_row,
                        label,
                        r["records"],
                        f"{r['full']}/{r['max_wait']}/{r['final']}",
                        _pct(r["fill_full"]),
                        _pct(r["fill_stream"]),
                        _pct(r["fill_all"]),
                        r["per_row"],
                    ]
                )
        print_table(
            f"3. Packing fill, {mix} oracle-transcript lengths (mean {np.mean(lengths):.0f}, "
            f"min {min(lengths)}, max {max(lengths)} tokens): {len(lengths)} trajectories in groups of 4 "
            f"arriving at {args.traj_rate:g} traj/s (simulated clock)",
            [
                "shape",
                "max seg/row",
                "flush policy",
                "records",
                "full/max-wait/final",
                "fill (full recs)",
                "fill (stream)",
                "fill (all)",
                "traj/row",
            ],
            rows,
            "fill = non-pad tokens / all tokens of the records. 'stream' = full + max-wait records (what a running "
            "job emits); 'all' adds the end-of-stream flush. (sim) = simulated packer policy, not in pipelines/ today.",
        )


def _pct(x):
    return "-" if x is None else f"{x:.1%}"


# ----------------------------------------------------------------------------- 4. flush latency
def bench_flush(args, lengths: list[int]) -> None:
    from _packer_pipeline import PackerPipelineConfig  # Beam: imported only when this section runs

    from core import config
    from core.contracts import pubsub_io, records
    from localstack.emulators.pubsub import PubSubEmulator
    from localstack.launch.commands import LOCAL_RUNNER
    from localstack.launch.processes import ProcessGroup

    shape = (args.flush_rows, LENGTH)
    workdir = tempfile.mkdtemp(prefix="bench-flush-")
    t_start = time.perf_counter()
    with PubSubEmulator(log_dir=os.path.join(workdir, "emulator")) as emu:
        tin, tout = emu.create_topic("bench-groups"), emu.create_topic("bench-records")
        sin, sout = (
            emu.create_subscription("bench-groups-sub", "bench-groups"),
            emu.create_subscription("bench-records-sub", "bench-records"),
        )
        env = {**os.environ, **emu.env(), "JAX_PLATFORMS": "cpu"}
        packer = config.build(
            PackerPipelineConfig,
            input_subscription=sin,
            output_topic=tout,
            rows=args.flush_rows,
            seq_len=LENGTH,
            max_segments_per_row=args.flush_segments,
            max_wait_s=args.max_wait_s,
        )
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_packer_pipeline.py")
        # Beam's own flags are Beam's, as for the rollout job (localstack/launch/commands.py).
        cmd = [sys.executable, script, *LOCAL_RUNNER, f"--project={emu.project}", *config.to_argv(packer)]
        pub, sub = emu.publisher(), pubsub_io.subscriber_client(emu.env()[pubsub_io.EMULATOR_ENV])
        got: list[tuple[float, dict, list[str]]] = []
        stop = threading.Event()

        def puller():
            while not stop.is_set():
                msgs = pubsub_io.pull(sub, sout, 100, timeout_s=1.0)
                pubsub_io.ack(sub, sout, [m.ack_id for m in msgs])
                for m in msgs:
                    rec = records.decode(m.message.data, shape)
                    got.append(
                        (
                            m.message.publish_time.timestamp(),
                            dict(m.message.attributes),
                            [t.trajectory_id for t in rec.trajectories],
                        )
                    )

        finished: dict[str, float] = {}
        phase_of: dict[str, str] = {}
        lens = iter(lengths * 100)

        def publish_group(rid: str, phase: str):
            lg = [next(lens) for _ in range(4)]
            now = time.time()
            for i in range(4):
                finished[f"{rid}/{i}"] = now
                phase_of[f"{rid}/{i}"] = phase
            return pubsub_io.publish(
                pub, tin, json.dumps({"request_id": rid, "finished_at": now, "lengths": lg}).encode()
            )

        th = threading.Thread(target=puller, daemon=True)
        th.start()
        with ProcessGroup(cmd, os.path.join(workdir, "pipeline.log"), env) as pipeline:
            # Ready when a warm-up group comes back as a record.
            deadline, k = time.monotonic() + 180, 0
            while not any(p.startswith("warm") for _, _, ids in got for p in ids):
                if pipeline.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"packer pipeline not ready:\n{pipeline.log_tail()}")
                publish_group(f"warm{k}", "warm").result()
                k += 1
                time.sleep(1.0)
            ready_s = time.perf_counter() - t_start
            time.sleep(args.max_wait_s + 2)
            for rate in args.flush_rates:
                gps = rate / 4
                t0, n, futures = time.monotonic(), 0, []
                while time.monotonic() < t0 + args.flush_phase_s:
                    futures.append(publish_group(f"r{rate:g}-{n}", f"{rate:g}"))
                    n += 1
                    time.sleep(max(0.0, t0 + n / gps - time.monotonic()))
                for f in futures:
                    f.result()
                time.sleep(args.max_wait_s + 3)
            want = {t for t, p in phase_of.items() if p != "warm"}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not want <= {i for _, _, ids in got for i in ids}:
                time.sleep(0.5)
            alive = pipeline.poll() is None
            log_tail = pipeline.log_tail()
        stop.set()
        th.join(timeout=5)
    if not alive:
        print(f"[flush] pipeline exited early:\n{log_tail}")
    seen = {}
    rec_by_phase: dict[str, list] = {}
    for pt, attrs, ids in got:
        phases = {phase_of.get(i) for i in ids}
        for i in ids:
            seen.setdefault(i, pt)
        for p in phases:
            rec_by_phase.setdefault(p, []).append(attrs)
    rows = []
    for rate in args.flush_rates:
        p = f"{rate:g}"
        tids = [t for t, ph in phase_of.items() if ph == p]
        lat = np.array([seen[t] - finished[t] for t in tids if t in seen]) * 1000
        recs = rec_by_phase.get(p, [])
        reasons = {}
        for a in recs:
            reasons[a.get("flush_reason")] = reasons.get(a.get("flush_reason"), 0) + 1
        packer = np.array(
            [float(a["packer_latency_ms"]) for a in recs if a.get("packer_latency_ms") not in (None, "None")]
        )
        fill = statistics.fmean(int(a["num_tokens"]) / (args.flush_rows * LENGTH) for a in recs) if recs else None
        q = (lambda x, v: float(np.percentile(x, v))) if len(lat) else (lambda x, v: None)
        rows.append(
            [
                p,
                len(tids),
                len(lat),
                len(recs),
                q(lat, 50),
                q(lat, 95),
                q(lat, 99),
                float(lat.max()) if len(lat) else None,
                float(np.percentile(packer, 95)) if len(packer) else None,
                " ".join(f"{k}:{v}" for k, v in sorted(reasons.items())),
                _pct(fill),
            ]
        )
    print_table(
        f"4. Flush latency (packer alone, BundleBasedDirectRunner, emulator): shape {args.flush_rows}x{LENGTH}, "
        f"{args.flush_segments} seg/row, max_wait {args.max_wait_s:g} s, {args.flush_phase_s:g} s per rate",
        [
            "traj/s",
            "trajectories",
            "seen",
            "records",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "max ms",
            "packer p95 ms",
            "flush reasons",
            "mean fill",
        ],
        rows,
        f"latency per trajectory = record's Pub/Sub publish_time - the trajectory's finished_at (stamped when its "
        f"group was published to the input topic). packer p95 = the packer's own emit time - oldest finished_at "
        f"in the record (per record). Pipeline ready after {ready_s:.0f} s.",
    )
