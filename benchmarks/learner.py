"""Learner-side benchmarks: the learner-alone ceiling, step time against batch size,
record decode and consumer poll throughput.

    python benchmarks/learner.py            # everything (~3 min on 2 cores)
    python benchmarks/learner.py --quick    # a short run of everything (~1.5-2 min)
    python benchmarks/learner.py --sections steps,decode

Tiny model (core.policy.model.config.ModelConfig() defaults, random init), JAX on CPU. Records are
built by tests/_learner_data.random_record (1-3 segments per row, a 4-token prompt
then generated tokens), encoded with core.contracts.records.encode and attributes().

1. ceiling: start the Pub/Sub emulator, pre-fill a subscription with --records packed
   records of [--rows, --seq_len], then run the real loop of trainer/task.py without the
   feeder: RecordConsumer.poll(max_messages=10, timeout_s=1.0) -> per-shape buffer ->
   Learner.train_step(batch_records records) until every record is trained. The step is
   compiled beforehand on other records (compile time shown apart). Duty cycle = time
   inside train_step / wall time of the loop. pull / decode / ack are timed by wrapping
   core.contracts.pubsub_io.pull, core.contracts.pubsub_io.ack and trainer.learning.data.consumer.decode.
2. steps: Learner.train_step at batch_records 1, 2, 4, 8 after warm-up: mean/p50/p95 of
   the whole call (stack the records, host->device, jitted step, metrics to floats), the
   jitted step alone on a device-resident batch (block_until_ready), tokens/s, and
   FLOP/s from XLA's cost analysis of the step Learner._executable compiled for the shape
   (in the layout train_step chose),
   and the model's forward alone for comparison.
   profile: a jax.profiler trace of a few steps at --batch_records; XLA op CPU time by op
   kind, forward+update against backward.
3. decode: core.contracts.records.decode alone (in-process) for [4,256] and [8,512] records,
   with the share spent in PackedRecord.validate; then RecordConsumer.poll throughput
   (messages pulled + decoded + acked per second) from a pre-filled subscription
   (section "poll"), at max_messages 10 (what trainer/task.py asks for) and 100.

The emulator (a gcloud + java process group) is stopped on exit, also on error.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tests"))  # _learner_data.random_record
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _learner_common import PhaseTimer, StepCall, make_records, pct, publish_records  # noqa: E402
from _learner_decode import bench_decode, bench_poll  # noqa: E402
from _learner_profile import bench_profile, forward_ms  # noqa: E402
from _report import loadavg, machine_info, print_table, stop_children_on_exit  # noqa: E402

from core import config  # noqa: E402
from core.config import configclass, knob  # noqa: E402

SECTIONS = ("ceiling", "steps", "profile", "decode", "poll")


# ----------------------------------------------------------------------------- 1. ceiling
def bench_ceiling(args, emu) -> None:
    from core.policy.model.config import ModelConfig
    from trainer.learning.data.consumer import RecordConsumer
    from trainer.learning.step.learner import Learner, LearnerConfig

    shape = (args.rows, args.seq_len)
    name = f"bench-ceiling-{os.getpid()}"
    topic = emu.create_topic(name)
    sub = emu.create_subscription(name + "-sub", name, ack_deadline_s=600)
    records = make_records(100_000, args.records, *shape)
    pub_s, nbytes = publish_records(emu, topic, records)
    print(
        f"published {len(records)} records of {shape[0]}x{shape[1]} ({nbytes / len(records) / 1e3:.1f} kB each) "
        f"in {pub_s:.2f} s ({len(records) / pub_s:.0f} msg/s)",
        flush=True,
    )

    learner = Learner(ModelConfig(), LearnerConfig(batch_records=args.batch_records))
    warm = make_records(200_000, args.batch_records, *shape)
    t0 = time.perf_counter()
    learner.train_step(warm)  # compile outside the measured loop
    compile_s = time.perf_counter() - t0
    for _ in range(2):
        learner.train_step(warm)

    consumer = RecordConsumer(sub, {shape})
    buffers: dict[tuple, list] = {shape: []}
    phases = PhaseTimer()
    train_s = 0.0
    steps = tokens = loss_tokens = trained = 0
    need = len(records) - len(records) % args.batch_records
    deadline = time.monotonic() + args.ceiling_timeout_s
    with phases.installed():
        t_start = time.perf_counter()
        while trained < need and time.monotonic() < deadline:
            for rec in consumer.poll(max_messages=10, timeout_s=1.0):
                buffers[rec.shape].append(rec)
            for buf in buffers.values():
                while len(buf) >= args.batch_records:
                    batch, buf[:] = buf[: args.batch_records], buf[args.batch_records :]
                    t0 = time.perf_counter()
                    learner.train_step(batch)
                    train_s += time.perf_counter() - t0
                    consumer.settle(batch)
                    steps += 1
                    trained += len(batch)
                    tokens += sum(r.num_tokens for r in batch)
                    loss_tokens += sum(r.num_loss_tokens for r in batch)
        wall = time.perf_counter() - t_start
    consumer.close()
    if trained < need:
        print(f"WARNING: trained only {trained}/{need} records before --ceiling_timeout_s", flush=True)
    if learner.compiled_variants() != 1:
        print(f"WARNING: {learner.compiled_variants()} compiled step variants for one shape", flush=True)

    print_table(
        f"1. Learner-alone ceiling: {trained} records {shape[0]}x{shape[1]} from a pre-filled emulator "
        f"subscription, batch_records={args.batch_records}, poll(max_messages=10)",
        [
            "wall s",
            "steps",
            "steps/s",
            "tokens/s",
            "loss tokens/s",
            "tokens/s in step",
            "duty cycle",
            "records/s",
            "compile s",
        ],
        [
            [
                wall,
                steps,
                steps / wall,
                tokens / wall,
                loss_tokens / wall,
                tokens / train_s if train_s else None,
                train_s / wall,
                trained / wall,
                compile_s,
            ]
        ],
        note=(
            f"tokens = non-pad tokens ({tokens / trained:.0f} per record of {shape[0] * shape[1]}); "
            f"loss tokens = loss_mask 1 ({loss_tokens / trained:.0f} per record); "
            f"duty cycle = time inside train_step / wall."
        ),
    )
    other = wall - train_s - sum(phases.s.values())
    print_table(
        "1b. Where the loop's wall time went",
        ["train_step s", "pull s", "decode s", "ack s", "other s", "pulls", "empty pulls", "msgs/pull"],
        [
            [
                train_s,
                phases.s["pull"],
                phases.s["decode"],
                phases.s["ack"],
                other,
                phases.pulls,
                phases.empty_pulls,
                phases.messages / phases.pulls if phases.pulls else None,
            ]
        ],
        note=(
            f"shares of wall: train {train_s / wall:.1%}, pull {phases.s['pull'] / wall:.1%}, "
            f"decode {phases.s['decode'] / wall:.1%}, ack {phases.s['ack'] / wall:.1%}, other {other / wall:.1%}"
        ),
    )


# ----------------------------------------------------------------------------- 2. steps
def bench_steps(args) -> None:
    import jax

    from core.policy.model.config import ModelConfig
    from trainer.learning.step.learner import Learner, LearnerConfig, batch_from_records

    shape = (args.rows, args.seq_len)
    pool = make_records(300_000, max(args.batch_sizes) * 2, *shape)
    rows = []
    for b in args.batch_sizes:
        learner = Learner(ModelConfig(), LearnerConfig(batch_records=b))
        batches = [pool[:b], pool[b : 2 * b]]  # alternate two batches
        t0 = time.perf_counter()
        call = StepCall(learner, batches[0])  # the first train_step: compiles
        compile_s = time.perf_counter() - t0
        flops = call.flops(learner)
        for i in range(args.warmup):
            learner.train_step(batches[i % 2])
        times = []
        for i in range(args.steps):
            t0 = time.perf_counter()
            learner.train_step(batches[i % 2])
            times.append(time.perf_counter() - t0)
        variants = learner.compiled_variants()  # one shape: 1 expected
        # The jitted step alone: batch already on device, no metric conversion. A committed
        # device array is another jit cache key than a numpy batch: one more (untimed) compile.
        dev = [jax.device_put(batch_from_records(x)) for x in batches]
        jax.block_until_ready(dev)
        jit_times = []
        for i in range(-1, args.steps):
            t0 = time.perf_counter()
            m = call.call_with(learner, dev[i % 2])
            jax.block_until_ready((learner.params, m))
            if i >= 0:
                jit_times.append(time.perf_counter() - t0)
        fwd_ms = forward_ms(learner, dev, args.steps)
        tok = statistics.mean(sum(r.num_tokens for r in x) for x in batches)
        ltok = statistics.mean(sum(r.num_loss_tokens for r in x) for x in batches)
        mean = statistics.mean(times)
        rows.append(
            [
                b,
                b * shape[0],
                mean * 1e3,
                pct(times, 50) * 1e3,
                pct(times, 95) * 1e3,
                statistics.mean(jit_times) * 1e3,
                fwd_ms,
                tok / mean,
                ltok / mean,
                b * shape[0] * shape[1] / mean,
                flops / 1e9,
                flops / mean / 1e9,
                compile_s,
                variants,
            ]
        )
        print(f"  batch_records={b}: done ({args.steps} timed steps, load {loadavg()})", flush=True)
    print_table(
        f"2. Learner.train_step against batch size: records {shape[0]}x{shape[1]}, {args.warmup} warm-up + "
        f"{args.steps} timed steps each",
        [
            "batch_records",
            "rows",
            "mean ms",
            "p50 ms",
            "p95 ms",
            "jit-only ms",
            "fwd ms",
            "tokens/s",
            "loss tokens/s",
            "slots/s",
            "GFLOP/step",
            "GFLOP/s",
            "compile s",
            "variants",
        ],
        rows,
        note=(
            "ms = one train_step call (stack records, host->device, jitted step, metrics to float); "
            "jit-only = the compiled step on a device-resident batch + block_until_ready; "
            "fwd = the model's forward + token log-probs alone (no loss, no gradient), jitted; "
            "slots/s counts padding too; GFLOP from compile().cost_analysis()['flops'], GFLOP/s = that / mean; "
            "variants = learner.compiled_variants() after the timed train_steps."
        ),
    )


# ----------------------------------------------------------------------------- main
QUICK = {"records": 40, "steps": 5, "warmup": 1, "decode_n": 100, "poll_records": 100, "profile_steps": 2}


@configclass
class LearnerBenchConfig:
    quick: bool = knob(False, "a short run of every section: sets " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    sections: tuple[str, ...] = knob(SECTIONS, f"comma-separated subset of {SECTIONS}", choices=SECTIONS)
    rows: int = knob(4, "rows per record")
    seq_len: int = knob(256, "tokens per record row")
    records: int = knob(200, "ceiling: records pre-filled")
    batch_records: int = knob(2, "ceiling: records per step")
    ceiling_timeout_s: float = knob(300.0, "ceiling: give up after this long")
    batch_sizes: tuple[int, ...] = knob((1, 2, 4, 8), "steps: batch_records values")
    warmup: int = knob(3, "steps: untimed steps after compile")
    steps: int = knob(20, "steps: timed steps per batch size")
    profile_steps: int = knob(5, "profile: traced steps")
    profile_top: int = knob(8, "profile: op kinds listed")
    decode_n: int = knob(500, "decode: decodes per shape")
    poll_records: int = knob(500, "poll: records pre-filled")
    poll_max_messages: tuple[int, ...] = knob((10, 100), "poll: max_messages values")


def parse_args(argv=None) -> LearnerBenchConfig:
    cfg = config.parse(LearnerBenchConfig, argv, description=__doc__)
    return dataclasses.replace(cfg, **QUICK) if cfg.quick else cfg


def main(argv=None) -> int:
    stop_children_on_exit()
    args = parse_args(argv)
    info = machine_info()
    print(f"{datetime.datetime.now().isoformat(timespec='seconds')}  {info}  load {loadavg()}", flush=True)
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}\n", flush=True)
    t_all = time.perf_counter()
    if "steps" in args.sections:
        bench_steps(args)
    if "profile" in args.sections:
        bench_profile(args)
    if "decode" in args.sections:
        bench_decode(args)
    if {"ceiling", "poll"} & set(args.sections):
        from localstack.emulators.pubsub import PubSubEmulator

        t0 = time.perf_counter()
        with PubSubEmulator() as emu:
            emu.apply_env()  # RecordConsumer's clients read PUBSUB_EMULATOR_HOST
            print(f"emulator up at {emu.host} in {time.perf_counter() - t0:.1f} s\n", flush=True)
            if "ceiling" in args.sections:
                bench_ceiling(args, emu)
            if "poll" in args.sections:
                bench_poll(args, emu)
    print(f"total {time.perf_counter() - t_all:.0f} s, load {loadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
