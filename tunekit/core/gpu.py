"""What one GPU row holds (`GPU`), each figure a `Sourced` (value, where it comes from), checked
when the row is made: a figure without its source is refused at import, naming the card and
the field. The rows themselves are `core.gpus.GPUS`; the lookups, `core.specs`. Pure, no torch.

    >>> GPU("Card", ("card",), peaks=Sourced({"bf16": 100}, "Card data sheet"), memory=80)
    Traceback (most recent call last):
    ...
    ValueError: GPU 'Card': memory=80 has no source: write Sourced(80, 'where the figure comes from')
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from tunekit.core.registry import DTYPES


@dataclass(frozen=True)
class Sourced:
    """One figure and its source: a public reference, or a benchmarks/RESULTS.md measurement
    ('measured YYYY-MM on a CARD, torch X.Y.Z')."""

    value: Any
    source: str


# the fused attention kernels a row may give a figure for (`tunekit.plan(attention_kernel=...)`
# names them; None: "flash", FA2-class, what torch's SDPA runs)
ATTENTION_KERNELS = {"flash": "FlashAttention-2 (torch's SDPA flash kernel)", "fa3": "FlashAttention-3 (Hopper)",
                     "triton": "the FlashAttention-1-era Triton kernel (llm-foundry attn_impl='triton', 2023)"}

# Where no driver total is published, the nominal size is read by the kind of memory. The factors
# are the published totals' own ratios (core.gpus.DRIVER_SOURCE): every GDDR card there reports
# 15/16 of its nominal GiB (ECC keeps 1/16: L4 23034 / 24576 MiB), consumer cards run without ECC,
# and HBM cards keep a small reserve (the H100's 81559 / 81920 MiB, the lowest of the HBM totals)
MEMORY_RULES = {"hbm": (81559 / 81920, "less the driver's reserve an H100 shows (81559 of 81920 MiB)"),
                "gddr-ecc": (15 / 16, "less ECC's 1/16 (L4, T4, L40S and A10 report 15/16 of it)"),
                "gddr": (1.0, "no ECC on a consumer card")}


_DICTS = ("mamf", "gemm", "attention")   # the row's fields that hold a dict of Sourced figures


@dataclass(frozen=True)
class GPU:
    """One accelerator, every figure the code needs of it, each `Sourced` (None: not known; the
    plan, bound or expectation that needs it says so). Units are in the comments; the properties
    below give the bare values under the names with units."""

    name: str                          # the name a plan and the picker show ("H100 SXM")
    match: tuple                       # lower-case substrings that all appear in the driver's name of it
    peaks: Sourced                     # {dtype: dense (no sparsity) spec-sheet TFLOPS}
    memory: Sourced | None = None      # nominal memory, GiB
    memory_kind: Literal["hbm", "gddr-ecc", "gddr"] = "hbm"   # how the nominal size reads (MEMORY_RULES)
    driver_total: Sourced | None = None   # bytes nvidia-smi / NVML report as the card's total
    bandwidth: Sourced | None = None   # memory bandwidth, TB/s (data sheet)
    bandwidth_share: Sourced | None = None   # the share of it a streaming kernel reaches (measured)
    mamf: dict = field(default_factory=dict)        # {dtype: Sourced(maximum achievable matmul TFLOPS)}
    gemm: dict = field(default_factory=dict)        # {dtype: Sourced(matmul TFLOPS at transformer training shapes)}
    sms: Sourced | None = None         # streaming multiprocessors (the waves a tiled matmul fills)
    attention: dict = field(default_factory=dict)   # {kernel: Sourced(((head_dim|None, seq, share), ...))}
    link: Sourced | None = None        # GPU-to-GPU inside a node, GB/s each way per GPU
    node_net: Sourced | None = None    # (NICs per node, GB/s NCCL reaches through each) of the node the card
                                       # ships in: what a collective across nodes leaves by (None: one NIC assumed)
    platform: Literal["cuda", "rocm"] = "cuda"
    capability: Sourced | None = None  # CUDA compute capability (major, minor): what torch's SDPA dispatch reads
    blas_workspace: Sourced | None = None   # bytes of one BLAS workspace where torch's CUDA rule does not give it
    borrows: Sourced | None = None     # Sourced(name of a measured card of the same chip, why): its shares
    runs_instead: dict = field(default_factory=dict)   # {dtype without a peak: (dtype trained instead, words)}

    def __post_init__(self):
        def refuse(what):
            raise ValueError(f"GPU {self.name!r}: {what}")

        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a GPU row needs a name, got {self.name!r}")
        if not self.match or not all(isinstance(m, str) and m == m.lower() and m for m in self.match):
            refuse(f"match={self.match!r}: lower-case substrings of the driver's name of the card")
        for f in fields(self):
            if f.name in ("name", "match", "memory_kind", "platform", "runs_instead"):
                continue
            value = getattr(self, f.name)
            if f.name in _DICTS and not isinstance(value, dict):
                refuse(f"{f.name}={value!r}: a dict of Sourced figures")
            pairs = value.items() if f.name in _DICTS else [(None, value)]
            for key, fig in pairs:
                where = f"{f.name}[{key!r}]" if key is not None else f.name
                if fig is None and key is None and f.name != "peaks":
                    continue
                if not isinstance(fig, Sourced):
                    refuse(f"{where}={fig!r} has no source: write Sourced({fig!r}, 'where the figure comes from')")
                if not isinstance(fig.source, str) or not fig.source.strip():
                    refuse(f"{where}={fig.value!r} has an empty source: name where the figure comes from")
        self._check_values(refuse)

    def _check_values(self, refuse):
        def positive(where, v):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                refuse(f"{where}={v!r}: a positive number")

        if not isinstance(self.peaks.value, dict):
            refuse(f"peaks={self.peaks.value!r}: a dict of dtype -> dense TFLOPS")
        rates = [*self.peaks.value.items(), *((d, f.value) for d, f in (*self.mamf.items(), *self.gemm.items()))]
        for dtype, v in rates:
            if dtype not in DTYPES:
                refuse(f"dtype {dtype!r}: one of {tuple(DTYPES)}")
            positive(f"{dtype} TFLOPS", v)
        for name in ("memory", "driver_total", "bandwidth", "sms", "link", "blas_workspace"):
            fig = getattr(self, name)
            if fig is not None:
                positive(name, fig.value)
        if self.node_net is not None:
            net = self.node_net.value
            if not (isinstance(net, tuple) and len(net) == 2 and isinstance(net[0], int) and net[0] > 0):
                refuse(f"node_net={net!r}: (NICs per node, GB/s NCCL reaches through each)")
            positive("node_net GB/s per NIC", net[1])
        if self.bandwidth_share is not None and not 0 < self.bandwidth_share.value <= 1:
            refuse(f"bandwidth_share={self.bandwidth_share.value!r}: a share in (0, 1]")
        if self.memory_kind not in MEMORY_RULES:
            refuse(f"memory_kind={self.memory_kind!r}: one of {tuple(MEMORY_RULES)}")
        if self.platform not in ("cuda", "rocm"):
            refuse(f"platform={self.platform!r}: 'cuda' or 'rocm'")
        if self.platform == "cuda" and self.capability is None:
            refuse("a CUDA card needs its compute capability (developer.nvidia.com/cuda-gpus)")
        for kernel in self.attention:
            if kernel not in ATTENTION_KERNELS:
                refuse(f"attention kernel {kernel!r}: one of {tuple(ATTENTION_KERNELS)}")
        for dtype, (instead, words) in self.runs_instead.items():
            if dtype in self.peaks.value or instead not in self.peaks.value or not words:
                refuse(f"runs_instead[{dtype!r}]: for a dtype without a peak, a dtype with one and the reason")

    # the bare figures, under the names with units that the readers use
    @property
    def tflops(self) -> dict:
        """{dtype: dense peak TFLOPS}."""
        return self.peaks.value

    @property
    def source(self) -> str:
        """Where the dense peaks come from."""
        return self.peaks.source

    @property
    def memory_gb(self) -> float | None:
        return self.memory.value if self.memory else None

    @property
    def driver_bytes(self) -> float | None:
        return self.driver_total.value if self.driver_total else None

    @property
    def bandwidth_tbs(self) -> float | None:
        return self.bandwidth.value if self.bandwidth else None

    @property
    def link_gbs(self) -> float | None:
        return self.link.value if self.link else None

    @property
    def usable(self) -> tuple[float, str] | None:
        """(bytes, where the figure comes from): the driver's total where one was published, else
        from the nominal size by the kind of memory (`MEMORY_RULES`); None without a size."""
        if self.driver_total:
            return self.driver_total.value, (f"{self.name}: {self.driver_total.value / 2**20:,.0f} MiB, the driver's "
                                             f"total ({self.driver_total.source})")
        if self.memory is None:
            return None
        factor, why = MEMORY_RULES[self.memory_kind]
        return self.memory.value * 2**30 * factor, f"{self.name}: {self.memory.value:g} GiB nominal, {why}"

    def figures(self):
        """(field, Sourced) of every figure the row holds: what tests/project/test_sources.py reads."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Sourced):
                yield f.name, value
            elif f.name in _DICTS:
                yield from ((f"{f.name}[{k!r}]", v) for k, v in value.items())


def attention_share(rows, head_dim: int | None, seq: int | None) -> float:
    """The share of the peak a fused attention kernel reaches at this head dim and sequence: the
    rows of the nearest head dim given (None rows: any), interpolated in log(seq), flat outside."""
    dims = {d for d, _, _ in rows}
    if head_dim is not None and dims - {None}:
        near = min(dims - {None}, key=lambda d: (abs(d - head_dim), d))
        rows = [r for r in rows if r[0] == near]
    pts = sorted((s, v) for _, s, v in rows)
    if seq is None or seq <= pts[0][0]:
        return pts[0][1]
    if seq >= pts[-1][0]:
        return pts[-1][1]
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        if s0 <= seq <= s1:
            f = math.log(seq / s0) / math.log(s1 / s0)
            return v0 + f * (v1 - v0)
    return pts[-1][1]


def check_table(rows, aliases: dict, default: str) -> None:
    """Refuse a table whose rows are not `GPU`s, share a name, borrow from or are aliased to a card
    it lacks, or whose default device is not one of its rows (core.gpus runs it at import)."""
    names = [r.name if isinstance(r, GPU) else None for r in rows]
    if None in names:
        raise ValueError(f"a GPU table holds GPU rows, got {rows[names.index(None)]!r}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"GPU rows named twice: {twice}")
    for row in rows:
        if row.borrows is not None and (row.borrows.value not in names or row.borrows.value == row.name):
            raise ValueError(f"GPU {row.name!r}: borrows from {row.borrows.value!r}, not another row of the table")
    for alias, target in aliases.items():
        if alias != alias.lower() or target not in names:
            raise ValueError(f"alias {alias!r} -> {target!r}: a lower-case name for a row of the table")
    if default not in names:
        raise ValueError(f"the default device {default!r} is not a row of the table")
