"""A monitored step's FLOPs and rates: model FLOPs from the model's shape or the count, and
tokens/s, TFLOPS, MFU and HFU from the step's wall time against the device's peak (resolved once
per dtype; on CPU a missing calibration runs when the Monitor is made, before the first step)."""
from __future__ import annotations

import math
import time

from tunekit.core.notes import Note
from tunekit.core.registry import FP32
from tunekit.core.units import is_missing
from tunekit.measure.device import dtype_name
from tunekit.measure.peaks import cached_calibration, rates, resolve_peak
from tunekit.monitor.arithmetic import fill_rates, model_flops_of
from tunekit.monitor.tap import dominant_dtype

NaN = math.nan


class FlopRates:
    """The FLOP side of a `Monitor` (``mon.flop_rates``)."""

    def __init__(self, mon):
        self.mon = mon
        self.peaks: dict = {}           # dtype -> measure.peaks.Peak
        self.per_token_cache: dict = {}
        self.conventions: dict = {}     # row's index -> how its model FLOPs were obtained (None: none)
        self.peak_tflops = self.peak_source = None

    def model_flops(self, info, cached) -> float:
        """The step's model FLOPs: given, else from the model's shape over the step's calls
        (never above what the count says ran), else the count's; called for the next row, whose
        convention it keeps in ``conventions``."""
        flops, convention = self._model_flops(info, cached)
        self.conventions[len(self.mon.rows)] = convention if not is_missing(flops) else None
        return flops

    def _model_flops(self, info, cached) -> tuple:
        calls = info["calls"] if self.mon.model_flops is None and not info["unknown"] else []
        per_token = [self.per_token(a, s, trained) for a, _, s, trained in calls]
        flops, convention, shaped_more = model_flops_of(
            self.mon.model_flops, per_token, [n for _, n, _, _ in calls],
            None if cached is None else cached.executed, None if cached is None else cached.model)
        if shaped_more:
            self.mon._note("MFU from the count: the model's shape gives more FLOPs than ran (frozen "
                           "weights get no weight gradients)")
        return flops, convention

    def per_token(self, adapter, seq, trained):
        """Model FLOPs per token from the shape (None: unknown), once per model, length and mode:
        the weights are counted on the model, which takes a walk over its modules."""
        key = (id(adapter), seq, trained)
        if key not in self.per_token_cache:
            known = adapter.shape is not None
            self.per_token_cache[key] = adapter.model_flops(seq, 1, None, backward=trained)[0] if known else None
        return self.per_token_cache[key]

    def prepare(self) -> None:
        """On a CPU with no peak given, the peak of the dtype the model's weights hold, resolved
        now, before the first step (``Monitor()`` calls it): a calibration (seconds, once per
        machine, then cached) never runs among the measured steps. Said in a note when it ran."""
        mon = self.mon
        if mon.peak is not None or mon.cuda_index is not None:
            return
        if mon.flops == "never" and mon.model_flops is None and mon.adapter.shape is None:
            return   # no FLOPs of any kind: no MFU to take against a peak
        dtype = mon.dtype or dtype_name(dominant_dtype(mon.model)) or FP32
        fresh = cached_calibration(mon.device, dtype) is None
        t0 = time.perf_counter()
        try:
            self.peaks[dtype] = peak = resolve_peak(mon.device, dtype, allow_calibration=True)
        except BaseException:   # a Ctrl-C in a calibration, say: the sinks opened already are closed
            mon.sinks.close()
            raise
        if fresh and peak.tflops is not None:
            mon._note(f"the CPU's {dtype} peak was calibrated before the first step "
                      f"({time.perf_counter() - t0:.1f} s, once: cached for the next runs)")

    def fill(self, row) -> None:
        """tokens/s or samples/s, TFLOPS, MFU and HFU of a measured row (`arithmetic.fill_rates`),
        against the peak of the step's dtype, resolved here once per dtype."""
        if is_missing(row["flops"]) and is_missing(row["model_flops"]):
            fill_rates(row, None)   # the amounts per second only
            return
        dtype = self.mon.dtype or self.mon.tap.dtype or FP32
        if dtype not in self.peaks:  # once per dtype; a CPU calibration runs here, untimed
            self.peaks[dtype] = resolve_peak(self.mon.device, dtype, given=self.mon.peak,
                                              allow_calibration=self.mon.cuda_index is None)
        peak = self.peaks[dtype]
        self.peak_tflops, self.peak_source = peak.tflops, peak.source
        if peak.tflops is None:
            self.mon._note(Note("rates.none", f"no peak known ({peak.source}): pass peak= (TFLOPS) for MFU"))
        # the arithmetic directly; peaks.rates (which also judges figures past the peak) only when
        # one is: it costs tens of microseconds a step
        if fill_rates(row, peak.tflops):
            r = rates(row["flops"], row["model_flops"], row["wall_s"], peak, self.mon.device, dtype, recheck=False)
            row["tflops"], row["mfu"], row["hfu"] = r.tflops, r.mfu, r.hfu
            if r.above_peak:
                self.mon._note(r.above_peak)
