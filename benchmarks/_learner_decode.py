"""Section 3 of benchmarks/learner.py: record decode alone and RecordConsumer.poll throughput."""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tests"))  # _learner_data.random_record
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _learner_common import PhaseTimer, make_records, pct, publish_records  # noqa: E402
from _report import print_table  # noqa: E402


# ----------------------------------------------------------------------------- 3. decode
def bench_decode(args) -> None:
    from core.contracts.records import decode, encode

    rows = []
    for shape in ((4, 256), (8, 512)):
        recs = make_records(400_000, 8, *shape)
        blobs = [encode(r) for r in recs]
        for b in blobs[:2]:
            decode(b)
        decoded = [decode(b) for b in blobs]
        dec, val, enc = [], [], []  # per call, interleaved so that load from other processes hits all three alike
        for i in range(args.decode_n):
            j = i % len(blobs)
            t0 = time.perf_counter()
            decode(blobs[j])
            t1 = time.perf_counter()
            decoded[j].validate()
            t2 = time.perf_counter()
            encode(recs[j])
            t3 = time.perf_counter()
            dec.append(t1 - t0)
            val.append(t2 - t1)
            enc.append(t3 - t2)
        mb = statistics.mean(len(b) for b in blobs) / 1e6
        d50, dmean = pct(dec, 50), statistics.mean(dec)
        rows.append(
            [
                f"{shape[0]}x{shape[1]}",
                mb * 1e3,
                d50 * 1e6,
                dmean * 1e6,
                pct(dec, 95) * 1e6,
                1 / dmean,
                mb / dmean,
                pct(val, 50) * 1e6,
                pct(val, 50) / d50,
                pct(enc, 50) * 1e6,
            ]
        )
    print_table(
        f"3a. core.contracts.records.decode alone, in-process ({args.decode_n} decodes per shape)",
        [
            "shape",
            "kB/record",
            "decode p50 us",
            "mean us",
            "p95 us",
            "records/s",
            "MB/s",
            "validate p50 us",
            "validate share",
            "encode p50 us",
        ],
        rows,
        note="decode = parse + copy arrays + PackedRecord.validate(); records/s and MB/s from the mean; "
        "validate = validate() alone on a decoded record (share = its p50 / decode p50); "
        "encode (producer side) also validates.",
    )


def bench_poll(args, emu) -> None:
    from trainer.learning.data.consumer import RecordConsumer

    shape = (4, 256)
    name = f"bench-poll-{os.getpid()}"
    topic = emu.create_topic(name)
    subs = {m: emu.create_subscription(f"{name}-{m}", name, ack_deadline_s=600) for m in args.poll_max_messages}
    records = make_records(500_000, args.poll_records, *shape)
    pub_s, nbytes = publish_records(emu, topic, records)
    print(
        f"published {len(records)} records of {shape[0]}x{shape[1]} in {pub_s:.2f} s "
        f"({len(records) / pub_s:.0f} msg/s, {nbytes / pub_s / 1e6:.1f} MB/s)",
        flush=True,
    )
    rows = []
    for m, sub in subs.items():
        consumer = RecordConsumer(sub, {shape})
        phases = PhaseTimer()
        got = 0
        deadline = time.monotonic() + 120
        with phases.installed():
            t0 = time.perf_counter()
            while got < len(records) and time.monotonic() < deadline:
                polled = consumer.poll(max_messages=m, timeout_s=1.0)
                consumer.settle(polled)  # no checkpointer: acked on the next poll, as in a learner without one
                got += len(polled)
            wall = time.perf_counter() - t0
        consumer.close()
        if got < len(records):
            print(f"WARNING: max_messages={m}: got {got}/{len(records)} before the 120 s deadline", flush=True)
        rows.append(
            [
                m,
                got,
                wall,
                got / wall,
                got * nbytes / len(records) / wall / 1e6,
                phases.pulls,
                phases.messages / phases.pulls if phases.pulls else None,
                phases.s["pull"] / wall,
                phases.s["decode"] / wall,
                phases.s["ack"] / wall,
            ]
        )
    print_table(
        f"3b. RecordConsumer.poll from a pre-filled emulator subscription: "
        f"{len(records)} records {shape[0]}x{shape[1]}",
        [
            "max_messages",
            "records",
            "wall s",
            "records/s",
            "MB/s",
            "pulls",
            "msgs/pull",
            "pull share",
            "decode share",
            "ack share",
        ],
        rows,
        note="records/s = messages pulled + decoded + validated + acked per second by one consumer, no training.",
    )
