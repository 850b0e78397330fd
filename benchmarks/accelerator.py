"""The learner and the engine on the accelerator JAX finds (a TPU v5e where lent), with the
project's own Learner and Sampler on random weights of real configs' shapes.

    python benchmarks/accelerator.py [--sections peak,learner,engine] [--out FILE]
    python benchmarks/accelerator.py --tiny          # the CPU case CI runs (seconds)

On the TPU machine it installs what it needs from that machine's own package index first
(flax, optax, orbax-checkpoint, safetensors, google-api-core, google-auth into
/tmp/site, appended to sys.path so the machine's JAX stays first). It never sets
JAX_PLATFORMS: it measures whatever JAX picked, and says which device that was.

Sections, all in one process (one program at a time may hold a TPU):
1. peak: a bf16 matmul's FLOP/s and a reduction's HBM read rate, measured here;
2. learner: per case, the layout the memory search chose, compile seconds, step time,
   trained tokens/s, MFU (model FLOPs against the vendor's peak and the measured one),
   and memory; modes side by side (bf16 against f32, flash against XLA attention);
3. engine: the device-bound decode step, one token a call, and the engine end to end,
   each against the HBM-bandwidth bound of a step.
Results: tables on stdout, JSON in --out (default docs/results/accelerator_<backend>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

SITE = "/tmp/site"
INDEX = "/opt/pypi/simple"
PACKAGES = ("flax>=0.12,<0.13", "optax>=0.2.5", "orbax-checkpoint>=0.11", "safetensors", "google-api-core", "zstandard")
PACKAGES += ("google-auth",)
SECTIONS = ("peak", "learner", "engine")  # and "profile": where one learner case's step time goes
# The vendor's figures per device kind (localstack/launch/accelerators.py has the sources).
VENDOR = {"TPU v5 lite": ("v5e", 197e12, 819e9), "TPU v5e": ("v5e", 197e12, 819e9)}


def ensure_packages() -> None:
    """flax, optax and zstandard from the machine's own index when they are missing (the TPU machine
    has JAX and nothing of the project's)."""
    if SITE not in sys.path and os.path.isdir(SITE):
        sys.path.append(SITE)
    try:
        import flax  # noqa: F401
        import optax  # noqa: F401
        import zstandard  # noqa: F401  (delta policy versions: core/contracts/store_delta.py)
    except ImportError:
        if not os.path.isdir(INDEX):
            raise SystemExit("flax and optax are missing: install the project (pip install -e .) first") from None
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "pip", "install", "--isolated", "-q", "--only-binary=:all:"]
        cmd += ["--index-url", f"file://{INDEX}", "--target", SITE, *PACKAGES]
        subprocess.run(cmd, check=True, env={**os.environ, "PIP_CONFIG_FILE": "/dev/null"})
        print(f"installed {', '.join(PACKAGES)} into {SITE} in {time.perf_counter() - t0:.0f} s", flush=True)
        if SITE not in sys.path:
            sys.path.append(SITE)


def learner_cases(tiny: bool):
    from _accelerator_learner import LearnerCase as C

    if tiny:
        return [C("tiny", 2, 256), C("tiny", 2, 256, 2, dtype="bfloat16", attention="splash"), C("tiny", 1, 512, 2, 4)]
    demo = dict(rows=4, seq_len=1152, segments=3)
    return [
        C("smollm2-135m", 8, 1024),
        C("smollm2-135m", **demo),
        C("qwen2.5-0.5b", 8, 1024),
        C("qwen2.5-1.5b", 8, 1024, lora_rank=8),
        # Modes side by side, on the demo's layout: what each choice buys.
        C("smollm2-135m", **demo, dtype="float32", note="f32 compute"),
        C("smollm2-135m", **demo, attention="xla", note="XLA attention (banded)"),
        C("smollm2-135m", **demo, remat="on", note="remat forced on"),
        # What cannot fit must be refused by the project, with the numbers.
        C("qwen2.5-0.5b", 8, 2048, remat="off", micro_batches=1, note="one layout, too big: refused"),
        C("qwen2.5-1.5b", 8, 1024, note="full fine-tuning: refused"),
    ]


def engine_cases(tiny: bool):
    from _accelerator_engine import EngineCase as C

    if tiny:
        return [C("tiny", 4, 16, 16, "float32", 4, 16, 4)]
    return [
        C("smollm2-135m", 256),
        C("smollm2-135m", 256, decode_steps=1),
        C("smollm2-135m", 256, decode_steps=32),  # fewer host round trips than the default K
        C("smollm2-135m", 256, decode_steps=64),
        C("smollm2-135m", 64, dtype="float32"),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU case CI runs)")
    p.add_argument("--steps", type=int, default=5, help="timed learner steps after a warm-up step")
    p.add_argument("--only", default="", help="run only the learner cases whose 'label; note' is one of these (|)")
    p.add_argument("--engine_only", default="", help="run only the engine cases whose label contains this")
    p.add_argument("--profile", default="smollm2-135m 4 x 1152", help="the learner case the profile section runs")
    p.add_argument("--profile_note", default="", help="... and its note (picks one of the modes)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    ensure_packages()
    import jax
    from _accelerator_engine import run_and_free as run_engine
    from _accelerator_learner import hbm_bandwidth, matmul_peak
    from _accelerator_learner import run as run_learner
    from _report import machine_info, print_table

    device = jax.devices()[0]
    backend = jax.default_backend()
    _, vendor_flops, vendor_bw = VENDOR.get(device.device_kind, (device.device_kind, None, None))
    result = {"device": f"{device.device_kind} ({backend})", "machine": machine_info()}
    result["started"] = time.strftime("%F %T")
    result["command"] = "python benchmarks/accelerator.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"device: {result['device']}; {result['machine']}", flush=True)
    sections = args.sections.split(",")
    peak = bw = None
    if "peak" in sections:
        n = 1024 if args.tiny or backend == "cpu" else 8192
        peak, bw = matmul_peak(n), hbm_bandwidth(64 if args.tiny or backend == "cpu" else 1024)
        result["peak"] = {"matmul_flops": peak, "matmul_n": n, "hbm_bytes_per_s": bw}
        print_table("1. Measured peaks", ["", "measured", "vendor"], [
            [f"bf16 matmul {n}^3, TFLOP/s", peak / 1e12, (vendor_flops or 0) / 1e12 or None],
            ["HBM read, GB/s", bw / 1e9, (vendor_bw or 0) / 1e9 or None],
        ])  # fmt: skip
    vendor_flops = vendor_flops or peak
    if "learner" in sections:
        rows, result["learner"] = [], []
        for case in learner_cases(args.tiny):
            if args.only and f"{case.label}; {case.note}" not in args.only.split("|"):
                continue
            t0 = time.perf_counter()
            try:
                r = run_learner(case, args.steps, vendor_flops or 1.0, peak)
            except Exception as e:  # one case's failure must not lose the others
                r = {"label": case.label, "case": case.__dict__, "error": f"{type(e).__name__}: {str(e)[:2000]}"}
            r["wall_s"] = time.perf_counter() - t0
            result["learner"].append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "step_s_all"}), flush=True)
            rows.append(_learner_row(r))
        print_table(
            f"2. Learner on {result['device']}: one step, random weights of the real config",
            ["case", "note", "layout", "dtype, attention", "compile s (compiles)", "step s", "tok/s", "MFU",
             "MFU (measured peak)",
             "HBM GB (XLA: state + step)"],
            rows,
            note="MFU: model FLOPs (6 N a trained token + causal attention within segments; LoRA 4 N) / step time / "
            f"peak ({(vendor_flops or 0) / 1e12:.0f} TFLOP/s vendor)",
        )  # fmt: skip
    if "profile" in sections:
        from _accelerator_learner import profile

        case = next(c for c in learner_cases(args.tiny) if args.profile in c.label and c.note == args.profile_note)
        result["profile"] = prof = profile(case)
        print(json.dumps({k: v for k, v in prof.items() if k != "top"}), flush=True)
        print_table(
            f"Profile: {prof['label']} ({prof['layout']}), {prof['device_ms_per_step']:.1f} ms of device ops a step",
            ["op", "ms a step", "share", "count a step"],
            [[r["op"][:90], r["ms_per_step"], r["share"], r["count_per_step"]] for r in prof["top"]],
        )
    if "engine" in sections:
        rows, result["engine"] = [], []
        for case in engine_cases(args.tiny):
            if args.engine_only and args.engine_only not in case.label:
                continue
            try:
                r = run_engine(case, vendor_bw or bw or 1.0, bw)
            except Exception as e:
                r = {"label": case.label, "case": case.__dict__, "error": f"{type(e).__name__}: {str(e)[:2000]}"}
            result["engine"].append(r)
            print(json.dumps(r), flush=True)
            rows.append(_engine_row(r))
        print_table(
            f"3. Engine decode on {result['device']}: every slot busy, 64-token prompts, 128 sampled tokens each",
            ["case", "warm-up s", "device-bound tok/s", "one token a call tok/s", "engine end to end tok/s",
             "bound tok/s (full cache)", "end to end / bound", "bound tok/s (filled cache)", "end to end / bound"],
            rows,
            note="bound: (weights + KV cache read once a step) / HBM bandwidth (vendor's); device-bound: "
            "Sampler.decode_loop, 32 steps a call",
        )  # fmt: skip
    out = Path(args.out or HERE.parent / "docs" / "results" / f"accelerator_{backend}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")
    return 0


def _learner_row(r: dict) -> list:
    case = r["case"]
    if "error" in r or "refused" in r:
        why = (r.get("refused") or r.get("error"))[:300]
        return [r["label"], case.get("note", ""), why, "", "", "", "", "", "", ""]
    return [
        r["label"], case["note"], r["layout"], f"{r['dtype']}, {r['attention']}",
        f"{r['compile_s']:.1f} ({r['compiles']})", r["step_s"],
        r["tokens_per_s"], r["mfu"], r["mfu_measured_peak"], f"{r['xla_resident_gb']:.2f} + {r['xla_extra_gb']:.2f}",
    ]  # fmt: skip


def _engine_row(r: dict) -> list:
    if "error" in r:
        return [r["label"], r["error"][:300], "", "", "", "", "", "", ""]
    return [
        r["label"], r["warmup_s"], r["loop_tokens_per_s"], r["call_tokens_per_s"], r["engine_tokens_per_s"],
        r["bound_full_tokens_per_s"], r["engine_of_full_bound"], r["bound_filled_tokens_per_s"],
        r["engine_of_filled_bound"],
    ]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
