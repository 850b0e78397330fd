"""Accelerator figures for the scale planner (`localstack.launch.scale_plan`): the vendors'
published per-chip numbers, one row per chip with its source, and how a slice name
(`v5e-8`, `v5p-64`) or a rollout worker (`l4`, `h100x2`) maps to chips, hosts and the
Vertex AI / Dataflow settings that ask for it.

Every figure in CHIPS is the vendor's, dense (no structured sparsity): NVIDIA's
datasheets print BF16 Tensor Core figures "with sparsity", which are twice the dense ones,
so the dense half is written here. Nothing in this file is measured on this machine and
nothing is an efficiency: MFU and bandwidth efficiency are the planner's assumptions,
printed with every plan. Sources (read 2026-12): the URL on each row.
"""

from __future__ import annotations

import dataclasses
import re

GB = 1e9
TFLOPS = 1e12


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    bf16_flops: float  # dense peak, FLOP/s per chip
    hbm_bytes: float  # accelerator memory per chip
    hbm_bytes_per_s: float  # accelerator memory bandwidth per chip
    source: str  # where the three figures are published
    note: str = ""


CHIPS: dict[str, Chip] = {
    # Google: the "key specifications" table of each Cloud TPU version's page.
    "v5e": Chip("TPU v5e", 197 * TFLOPS, 16 * GB, 819 * GB, "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip(
        "TPU v5p", 459 * TFLOPS, 95 * GB, 2765 * GB, "https://cloud.google.com/tpu/docs/v5p", "2 TensorCores a chip"
    ),
    "v6e": Chip("TPU v6e (Trillium)", 918 * TFLOPS, 32 * GB, 1638 * GB, "https://cloud.google.com/tpu/docs/v6e"),
    # NVIDIA datasheets: BF16 Tensor Core, dense (the sheet's sparse figure / 2).
    "l4": Chip(
        "NVIDIA L4",
        121 * TFLOPS,
        24 * GB,
        300 * GB,
        "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet",
        "datasheet: 242 TFLOPS BF16 with sparsity",
    ),
    "a100-40gb": Chip(
        "NVIDIA A100 40GB SXM",
        312 * TFLOPS,
        40 * GB,
        1555 * GB,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    ),
    "a100-80gb": Chip(
        "NVIDIA A100 80GB SXM",
        312 * TFLOPS,
        80 * GB,
        2039 * GB,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    ),
    "h100": Chip(
        "NVIDIA H100 80GB SXM",
        989 * TFLOPS,
        80 * GB,
        3350 * GB,
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
        "datasheet: 1,979 TFLOPS BF16 with sparsity",
    ),
}

TPUS = ("v5e", "v5p", "v6e")
GPUS = ("l4", "a100-40gb", "a100-80gb", "h100")

# Vertex AI / GKE machine types per TPU host, by chips on the host.
_TPU_MACHINE = {
    "v5e": {1: "ct5lp-hightpu-1t", 4: "ct5lp-hightpu-4t", 8: "ct5lp-hightpu-8t"},
    "v6e": {1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"},
    "v5p": {4: "ct5p-hightpu-4t"},
}
# 2D slices of v5e / v6e (the TPU pages' topology tables), 3D of v5p, by chips.
_TOPOLOGY_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_TOPOLOGY_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8"}

# Dataflow worker VMs with one GPU each, and the worker_accelerator type Dataflow names.
_GPU_WORKER = {
    "l4": ("g2-standard-8", "nvidia-l4"),
    "a100-40gb": ("a2-highgpu-1g", "nvidia-tesla-a100"),
    "a100-80gb": ("a2-ultragpu-1g", "nvidia-a100-80gb"),
    "h100": ("a3-highgpu-1g", "nvidia-h100-80gb"),
}
_GPU_MACHINE_N = {
    "l4": {1: "g2-standard-8", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"},
    "a100-40gb": {1: "a2-highgpu-1g", 2: "a2-highgpu-2g", 4: "a2-highgpu-4g", 8: "a2-highgpu-8g"},
    "a100-80gb": {1: "a2-ultragpu-1g", 2: "a2-ultragpu-2g", 4: "a2-ultragpu-4g", 8: "a2-ultragpu-8g"},
    "h100": {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g", 8: "a3-highgpu-8g"},
}


@dataclasses.dataclass(frozen=True)
class Slice:
    """Chips that work as one: a learner's TPU slice or GPU host, or one rollout worker."""

    key: str  # a CHIPS key
    chips: int
    name: str  # as given: v5e-8, l4, h100x2

    @property
    def chip(self) -> Chip:
        return CHIPS[self.key]

    @property
    def flops(self) -> float:
        return self.chips * self.chip.bf16_flops

    @property
    def hbm_bytes(self) -> float:
        return self.chips * self.chip.hbm_bytes

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.chips * self.chip.hbm_bytes_per_s

    @property
    def hosts(self) -> int:
        if self.key in TPUS:
            per_host = 4 if self.key == "v5p" or self.chips > 8 else self.chips
            return max(1, self.chips // per_host)
        return 1

    def vertex(self) -> dict:
        """Vertex AI CustomJob settings (agentic-rl vertex flags) for a TPU learner."""
        if self.key not in TPUS:
            machine, accel = _GPU_WORKER[self.key]
            kind = accel.upper().replace("-", "_")
            machine = _GPU_MACHINE_N[self.key].get(self.chips, machine)
            return {
                "machine_type": machine,
                "accelerator_type": kind,
                "accelerator_count": self.chips,
                "replica_count": 1,
            }
        per_host = self.chips // self.hosts
        topology = (_TOPOLOGY_3D if self.key == "v5p" else _TOPOLOGY_2D).get(self.chips)
        return {
            "machine_type": _TPU_MACHINE[self.key].get(per_host, "?"),
            "tpu_topology": topology or "?",
            "replica_count": self.hosts,
        }

    def dataflow(self) -> dict:
        """Dataflow worker settings for a GPU rollout worker of this many GPUs."""
        if self.key not in GPUS:
            raise ValueError(f"{self.name}: Dataflow workers take GPUs ({', '.join(GPUS)}), not {self.key}")
        machine = _GPU_MACHINE_N[self.key].get(self.chips)
        if machine is None:
            raise ValueError(f"{self.name}: no {self.key} machine type with {self.chips} GPUs (1, 2, 4 or 8)")
        accel = _GPU_WORKER[self.key][1]
        return {
            "machine_type": machine,
            "dataflow_service_options": f"worker_accelerator=type:{accel};count:{self.chips};install-nvidia-driver",
        }


_NAME = re.compile(r"^(v5e|v5p|v6e|v5litepod)-(\d+)$|^([a-z0-9-]+?)(?:x(\d+))?$")


def parse_slice(name: str) -> Slice:
    """`v5e-8` (8 chips), `v6e-16`, `v5p-64` (64 TensorCores: 32 chips, as Cloud TPU names v5p
    slices), `l4`, `h100x8` (8 GPUs), `a100-80gb`."""
    text = name.strip().lower()
    m = _NAME.match(text)
    if m and m.group(1):
        key = "v5e" if m.group(1) == "v5litepod" else m.group(1)
        n = int(m.group(2))
        chips = n // 2 if key == "v5p" else n  # v5p names count TensorCores, two a chip
        if chips < 1 or (key == "v5p" and n % 2):
            raise ValueError(f"accelerator {name!r}: a {key} slice of {n} is not a whole number of chips")
        shapes = _TOPOLOGY_3D if key == "v5p" else _TOPOLOGY_2D
        if chips not in shapes:
            raise ValueError(f"accelerator {name!r}: {chips} chips is not a {key} slice here ({sorted(shapes)} chips)")
        return Slice(key, chips, text)
    if m and m.group(3) in GPUS:
        chips = int(m.group(4) or 1)
        if chips < 1:
            raise ValueError(f"accelerator {name!r}: at least one GPU")
        return Slice(m.group(3), chips, text)
    known = ", ".join([f"{t}-N" for t in TPUS] + [f"{g}[xN]" for g in GPUS])
    raise ValueError(f"accelerator {name!r} is not known; known: {known}")
