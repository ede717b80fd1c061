"""Dense (no sparsity) spec-sheet peak TFLOPS per accelerator, with the source of each figure.

Pure data + name matching: no torch import. Figures are vendor dense peaks as collected in
stas00/ml-engineering `compute/accelerator/README.md` (the "ml-eng" source below) and, for the
consumer/inference cards, Lightning's `fabric/utilities/throughput.py` `_CUDA_FLOPS` table.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tunekit.core.registry import DTYPES

_MLENG = "stas00/ml-engineering compute/accelerator/README.md, TFLOPS comparison table (dense)"
_LIGHTNING = "Lightning-AI/pytorch-lightning src/lightning/fabric/utilities/throughput.py _CUDA_FLOPS"
_ADA = "NVIDIA Ada (AD102) whitepaper: tensor bf16/fp16 with fp32 accumulate"
_AMPERE = "NVIDIA Ampere GA102 whitepaper: tensor bf16/fp16 with fp32 accumulate"
_TITAN = ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md: 96GB HBM2e, 2.4 TB/s, 500 W; its peak "
          "'between SXM and NVL', exact value unknown: the SXM's dense table figures, an upper bound")


@dataclass(frozen=True)
class Spec:
    name: str
    match: tuple[str, ...]  # all of these lower-case substrings must be in the device name
    tflops: dict            # dtype -> dense peak TFLOPS
    memory_gb: float | None
    source: str
    bandwidth_tbs: float | None = None  # memory bandwidth, TB/s (vendor data sheets; an MI250X GCD: half)
    link_gbs: float | None = None       # GPU-to-GPU within a node, GB/s each way per GPU (LINKS below)
    driver_bytes: float | None = None   # the total the driver reports (DRIVER_TOTALS below)

    @property
    def usable(self) -> tuple[float, str] | None:
        """(bytes, where the figure comes from): the driver's total where one was published, else
        from the nominal size by the kind of memory (`MEMORY_RULES`); None without a size."""
        if self.driver_bytes:
            return self.driver_bytes, (f"{self.name}: {self.driver_bytes / 2**20:,.0f} MiB, the driver's total "
                                       f"({DRIVER_SOURCE})")
        if self.memory_gb is None:
            return None
        factor, why = MEMORY_RULES[GDDR.get(self.name, "hbm")]
        return self.memory_gb * 2**30 * factor, f"{self.name}: {self.memory_gb:g} GiB nominal, {why}"


# Links inside one node, GB/s each way for one GPU (vendor data sheets give both ways summed):
# NVLink 4 900 GB/s on H100/H200 SXM, NVLink 5 1.8 TB/s on B200, NVLink 3 600 GB/s on A100 SXM,
# the H100 NVL pair bridge 600 GB/s, NVLink 2 300 GB/s on V100 SXM, Infinity Fabric 7 x 128 GB/s
# on MI300X; cards without such links talk over PCIe x16 (Gen5 64, Gen4 32, Gen3 16 GB/s each way).
LINKS = {"H100 NVL": 300, "H100 PCIe": 64, "H100 SXM": 450, "H100 SXM 96GB": 450, "H200 SXM": 450, "B200": 900,
         "A100": 300, "L40S": 32, "L4": 32, "A10G": 32, "V100 PCIe": 16, "V100 SXM": 150, "T4": 16, "RTX 4090": 32,
         "RTX 3090": 32, "MI300X": 448}
LINKS_SOURCE = "vendor data sheets (NVLink / Infinity Fabric / PCIe x16), each way per GPU"

# What nvidia-smi / NVML report as a card's total memory, MiB (what a process can ever hold, the
# CUDA context included): modal-labs/modal-client PR #2797 lists H100 81559, A100 80GB 81920,
# A100 40GB 40960, A10 23028, L40S 46068, L4 23034 and T4 15360 MiB (the GDDR cards with ECC on:
# below their nominal 48/24/16 GiB); an H100 NVL reports 99,961,274,368 bytes (fastfetch issue #1658)
DRIVER_TOTALS = {"H100 SXM": 81559 * 2**20, "H100 NVL": 99961274368, "A100 80GB": 81920 * 2**20,
                 "A100 40GB": 40960 * 2**20, "A10G": 23028 * 2**20, "L40S": 46068 * 2**20, "L4": 23034 * 2**20,
                 "T4": 15360 * 2**20}
DRIVER_SOURCE = "nvidia-smi totals: modal-labs/modal-client #2797, fastfetch-cli/fastfetch #1658"
# Where no driver total is published, the nominal size is read by the kind of memory. The factors
# are those totals' own ratios: every GDDR card above reports 15/16 of its nominal GiB (ECC keeps
# 1/16: L4 23034 / 24576 MiB), consumer cards run without ECC, and HBM cards keep a small reserve
# (the H100's 81559 / 81920 MiB, the lowest of the HBM totals above)
GDDR = {"L40S": "gddr-ecc", "L4": "gddr-ecc", "A10G": "gddr-ecc", "T4": "gddr-ecc", "RTX 4090": "gddr",
        "RTX 3090": "gddr"}
MEMORY_RULES = {"hbm": (81559 / 81920, "less the driver's reserve an H100 shows (81559 of 81920 MiB)"),
                "gddr-ecc": (15 / 16, "less ECC's 1/16 (L4, T4, L40S and A10 report 15/16 of it)"),
                "gddr": (1.0, "no ECC on a consumer card")}


# Order matters: the first spec whose substrings all match wins, so variants come first. A100 40GB's
# bandwidth, 1,555 GB/s, is the NVIDIA A100 data sheet's (the 80GB SXM: 2,039 GB/s).
SPECS: tuple[Spec, ...] = (
    Spec("H100 NVL", ("h100", "nvl"), {"fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}, 94, _MLENG, 3.9),
    Spec("H100 PCIe", ("h100", "pcie"), {"fp32": 51, "tf32": 378, "bf16": 756, "fp16": 756, "fp8": 1513}, 80,
         _MLENG, 2.0),
    # Meta's Grand Teton H100 (torchtitan's benchmarks): 96 GB HBM2e at 2.4 TB/s under a 500 W limit;
    # its peak is "between SXM and NVL, and we don't know its exact value": the SXM's, an upper bound
    Spec("H100 SXM 96GB", ("h100", "96gb"), {"fp32": 67, "tf32": 494.5, "bf16": 989, "fp16": 989, "fp8": 1979}, 96,
         _TITAN, 2.4),
    Spec("H100 SXM", ("h100",), {"fp32": 67, "tf32": 494.5, "bf16": 989, "fp16": 989, "fp8": 1979}, 80, _MLENG, 3.35),
    Spec("H200 SXM", ("h200",), {"fp32": 67, "tf32": 494.5, "bf16": 989, "fp16": 989, "fp8": 1979}, 141, _MLENG, 4.8),
    Spec("B200", ("b200",), {"fp32": 80, "tf32": 1125, "bf16": 2250, "fp16": 2250, "fp8": 4500}, 180, _MLENG, 8.0),
    Spec("A100 40GB", ("a100", "40gb"), {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 40, _MLENG, 1.555),
    Spec("A100 80GB", ("a100",), {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 80, _MLENG, 2.0),
    Spec("L40S", ("l40s",), {"fp32": 91.6, "tf32": 183, "bf16": 362, "fp16": 362, "fp8": 733}, 48, _MLENG, 0.86),
    # L4's 242 is an int8 figure in the source, so it is not listed as fp8.
    Spec("L4", ("l4",), {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121}, 24, _LIGHTNING, 0.3),
    Spec("A10G", ("a10",), {"fp32": 31.2, "tf32": 62.5, "bf16": 125, "fp16": 125}, 24, _LIGHTNING, 0.6),
    Spec("V100 PCIe", ("v100", "pcie"), {"fp32": 14, "fp16": 112}, None, _LIGHTNING),
    Spec("V100 SXM", ("v100",), {"fp32": 15.7, "fp16": 125}, None, _LIGHTNING),
    Spec("T4", ("t4",), {"fp32": 8.1, "fp16": 65}, 16, _LIGHTNING, 0.32),
    # GeForce cards: the tensor cores' bf16/fp16 rate with fp32 accumulation (what training uses),
    # half their fp16-accumulate rate; Lightning's table lists the CUDA cores' fp32 figure for
    # every dtype, which a bf16 run can beat (a "peak" below a measurement)
    Spec("RTX 4090", ("4090",), {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}, 24, _ADA, 1.008),
    Spec("RTX 3090", ("3090",), {"fp32": 35.6, "tf32": 35.6, "bf16": 71, "fp16": 71}, 24, _AMPERE, 0.936),
    # Per GCD, which is what one torch device is on an MI250X: half the package figures.
    Spec("MI250X (one GCD)", ("mi250",), {"fp32": 47.9 / 2, "bf16": 383 / 2, "fp16": 383 / 2}, 64, _MLENG, 3.2 / 2),
    Spec("MI300X", ("mi300",), {"fp32": 163.4, "tf32": 653.7, "bf16": 1300, "fp16": 1300, "fp8": 2610}, 192,
         _MLENG, 5.3),
)


# each card's link and driver total, by name
SPECS = tuple(replace(s, link_gbs=LINKS.get(s.name.split(" ")[0] if s.name.startswith("A100") else s.name),
                      driver_bytes=DRIVER_TOTALS.get(s.name)) for s in SPECS)


def find_spec(device_name: str | None) -> Spec | None:
    """The spec for a device name such as 'NVIDIA H100 80GB HBM3', or None if unknown.

    >>> find_spec("NVIDIA H100 PCIe").name
    'H100 PCIe'
    """
    if not device_name:
        return None
    name = device_name.lower().replace("-", " ")
    for spec in SPECS:
        if all(_has_token(name, m) for m in spec.match):
            return spec
    return None


def _has_token(name: str, needle: str) -> bool:
    # 'l4' must not match 'l40s', nor 't4' 'rtx 4090'-style names: require a word boundary
    # after short model numbers.
    i = name.find(needle)
    while i != -1:
        end = i + len(needle)
        before_ok = i == 0 or not name[i - 1].isalnum()
        after_ok = len(needle) > 3 or end == len(name) or not name[end].isdigit()
        if before_ok and after_ok:
            return True
        i = name.find(needle, i + 1)
    return False


def spec_peak(device_name: str | None, dtype: str = "bf16") -> tuple[float | None, str]:
    """(dense peak TFLOPS, source) from the spec table; (None, reason) when not known."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    spec = find_spec(device_name)
    if spec is None:
        return None, f"no spec-sheet peak for {device_name!r}"
    value = spec.tflops.get(dtype)
    if value is None:
        return None, f"{spec.name} has no dense {dtype} figure in the table"
    return float(value), f"spec sheet: {spec.name} dense {dtype} ({spec.source})"


# What a card runs a training dtype as where the table lists no peak for it (no tensor-core rate
# for it). bf16 and TF32 tensor cores arrive with Ampere, compute capability 8.0 (NVIDIA A100
# Tensor Core GPU Architecture whitepaper; torch.cuda.is_bf16_supported(including_emulation=False)
# is False below it): on a V100 or T4 half precision is fp16 with a gradient scaler, and tf32
# leaves the matmuls in fp32. CDNA2 has no TF32 (the AMD Instinct MI250X data sheet lists none;
# CDNA 3, the MI300's, adds it).
_BEFORE_AMPERE = {"bf16": ("fp16", "no bf16 tensor cores (they came with Ampere, compute capability 8.0): its "
                                   "half precision is fp16 with a gradient scaler (precision='fp16')"),
                  "tf32": ("fp32", "no TF32 tensor cores (they came with Ampere, compute capability 8.0): tf32 "
                                   "leaves its matmuls in fp32 (precision='fp32')")}
RUNS_INSTEAD = {"V100 PCIe": _BEFORE_AMPERE, "V100 SXM": _BEFORE_AMPERE, "T4": _BEFORE_AMPERE,
                "MI250X (one GCD)": {"tf32": ("fp32", "no TF32 (CDNA2; CDNA 3 added it): tf32 leaves its matmuls "
                                                      "in fp32 (precision='fp32')")}}


def runs_instead(spec: Spec, dtype: str) -> tuple[str, str] | None:
    """(the dtype training runs instead, what the card has: words after its name) for a dtype
    ``spec`` lists no peak for; None where it lists one or the table does not say.

    >>> runs_instead(find_spec("T4"), "bf16")[0]
    'fp16'
    """
    if dtype in spec.tflops:
        return None
    return RUNS_INSTEAD.get(spec.name, {}).get(dtype)
