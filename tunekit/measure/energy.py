"""Energy over a block: NVML's GPU energy counter and the CPU packages' RAPL counters. Measurement layer.

    >>> m = EnergyMeter(cuda_index=0).start(); ...; e = m.stop(wall_s)
    >>> e.joules, e.source, e.mean_w, e.note

- GPU: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded; Volta and newer).
- CPU: ``/sys/class/powercap/intel-rapl:N/energy_uj`` for each package N (its sub-domains,
  ``intel-rapl:N:M``, are parts of the package and would count twice), wrapping around at
  ``max_energy_range_uj``. Often readable only by root (since 2020, CVE-2020-8694).
Where neither can be read, the energy is NaN and ``note`` says why; never 0.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from tunekit.measure import nvml

NaN = math.nan
POWERCAP = Path("/sys/class/powercap")
_PACKAGE = re.compile(r"^intel-rapl:\d+$")
_RAPL: dict = {}  # powercap root -> (readable package folders, why none)


@dataclass
class Energy:
    joules: float = NaN
    source: str | None = None   # "nvml", "rapl" or "nvml+rapl"
    mean_w: float = NaN
    note: str | None = None


def rapl_packages(root=POWERCAP) -> list[Path]:
    """The package domains whose counter this process can read (root-only on most kernels)."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        if _PACKAGE.match(d.name):
            try:
                int((d / "energy_uj").read_text())
                out.append(d)
            except (OSError, ValueError):
                continue
    return out


def rapl_reason(root=POWERCAP) -> str:
    """Why RAPL cannot be read here (for the note)."""
    root = Path(root)
    if not root.is_dir():
        return f"no {root} (no RAPL on this machine or container)"
    if not any(_PACKAGE.match(d.name) for d in root.iterdir()):
        return f"no intel-rapl package domain under {root}"
    return f"{root}/intel-rapl:*/energy_uj is not readable by this user"


def rapl_delta_uj(before: int, after: int, max_range_uj: int) -> int:
    """Energy between two readings of one counter, across at most one wrap-around."""
    return after - before if after >= before else after + max_range_uj - before


def _nvml_mj(index):
    h = nvml.handle(index)
    if h is None:
        return None
    import pynvml

    return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(h))


class EnergyMeter:
    """Energy of a block from every counter readable here (GPU ``cuda_index`` and CPU packages)."""

    def __init__(self, cuda_index: int | None = None, powercap=POWERCAP):
        self.index, self.root = cuda_index, powercap if isinstance(powercap, Path) else Path(powercap)

    def start(self) -> "EnergyMeter":
        """Read the counters. ``none``: why no counter is readable here (no CUDA device, no
        readable RAPL package: nothing to read at `stop()`, whose Energy would say only that), else None."""
        self.none = None
        if self.index is None:  # (the CPU side alone, as found once: nothing per block where none is readable)
            known = _RAPL.get(self.root)
            if known is not None and not known[0]:
                self.none, self.notes, self.mj0, self.packages, self.uj0 = known[1], [known[1]], None, [], []
                return self
        self.notes = []
        self.mj0 = None
        if self.index is not None:
            try:
                self.mj0 = _nvml_mj(self.index)
                if self.mj0 is None:
                    self.notes.append(f"GPU energy n/a: {nvml.unavailable_reason()}")
            except Exception as e:  # NVMLError_NotSupported before Volta, driver errors
                self.notes.append(f"GPU energy n/a: NVML has no energy counter here ({e})")
        known = _RAPL.get(self.root)
        if known is None:  # which packages are readable does not change: look once
            found = rapl_packages(self.root)
            known = _RAPL[self.root] = found, None if found else f"CPU energy n/a: {rapl_reason(self.root)}"
        self.packages, why = known
        if why:
            self.notes.append(why)
        self.uj0 = [int((d / "energy_uj").read_text()) for d in self.packages]
        return self

    def stop(self, wall_s: float) -> Energy:
        joules, sources = 0.0, []
        if self.mj0 is not None:
            try:
                joules += (_nvml_mj(self.index) - self.mj0) / 1e3
                sources.append("nvml")
            except Exception as e:
                self.notes.append(f"GPU energy n/a: {e}")
        if self.packages:
            try:
                cpu_uj = 0
                for d, uj0 in zip(self.packages, self.uj0):
                    uj1 = int((d / "energy_uj").read_text())
                    cpu_uj += rapl_delta_uj(uj0, uj1, int((d / "max_energy_range_uj").read_text()))
                joules += cpu_uj / 1e6
                sources.append("rapl")
            except (OSError, ValueError) as e:
                self.notes.append(f"CPU energy n/a: {e}")
        note = "; ".join(self.notes) or None
        if not sources:
            return Energy(note=note or "no energy counter readable")
        mean_w = joules / wall_s if wall_s and wall_s > 0 else NaN
        return Energy(joules, "+".join(sources), mean_w, note)
