"""The Monitor's arithmetic alone (tunekit/monitor/arithmetic.py), on plain numbers: no torch, no
clock, no device, as Lightning tests its ``Throughput``."""
import math
import subprocess
import sys

from tunekit.core.formulas import MFU_ANALYTIC, MFU_COUNTED
from tunekit.monitor.arithmetic import (
    amounts,
    error_text,
    fill_rates,
    model_flops_of,
    speeds_measured,
    step_row,
    window_due,
    window_figures,
)

NaN = math.nan


def _row(**over):
    kw = dict(wall_s=0.5, step_s=0.4, wait_s=0.1, tokens=2048, samples=None, executed=6e12, model_flops=5e12,
              flops_source="cached", gpu={}, alloc0=NaN, warmup=False, counted=False, traced=False, left=False,
              error=None)
    kw.update(over)
    return step_row(3, None, **kw)


def test_it_loads_no_torch():
    code = "import sys, tunekit.monitor.arithmetic; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_rates_of_a_measured_step():
    row = _row()
    assert fill_rates(row, peak_tflops=100.0) is False
    assert row["tokens_per_s"] == 4096.0           # 2048 tokens / 0.5 s
    assert math.isnan(row["samples_per_s"])        # no samples given nor read
    assert row["tflops"] == 12.0                   # 6e12 / 0.5 s / 1e12
    assert row["mfu"] == 0.1                       # 5e12 / 0.5 s / 1e12 / 100 TFLOPS
    assert row["hfu"] == 0.12                      # 6e12 / 0.5 s / 1e12 / 100


def test_above_the_peak_is_said_and_no_peak_gives_tflops_only():
    row = _row(executed=8e12, model_flops=6e12)
    assert fill_rates(row, peak_tflops=10.0) is True   # HFU 8e12 / 0.5 / 1e12 / 10 = 1.6 > 1
    assert row["hfu"] == 1.6 and row["mfu"] == 1.2     # MFU 6e12 / 0.5 / 1e12 / 10
    row = _row()
    assert fill_rates(row, peak_tflops=None) is False
    assert row["tflops"] == 12.0 and math.isnan(row["mfu"]) and math.isnan(row["hfu"])
    row = _row(executed=NaN, model_flops=NaN, tokens=None, samples=8)
    fill_rates(row, peak_tflops=100.0)
    assert row["samples_per_s"] == 16.0 and math.isnan(row["tflops"])   # 8 samples / 0.5 s


def test_a_row_and_its_memory():
    row = _row(gpu={"gpu_alloc_delta_bytes": 1024, "gpu_peak_delta_bytes": 4096, "gpu_reserved_bytes": 8192},
               alloc0=1000.0)
    assert (row["step"], row["wall_s"], row["tokens"]) == (3, 0.5, 2048.0)
    assert (row["gpu_alloc_bytes"], row["gpu_peak_bytes"], row["gpu_reserved_bytes"]) == (2024.0, 5096.0, 8192.0)
    assert math.isnan(_row()["gpu_peak_bytes"]) and math.isnan(_row()["samples"])   # off CUDA; none given
    framework = step_row(3, 41, wall_s=1.0, step_s=1.0, wait_s=0.0, tokens=None, samples=None, executed=NaN,
                         model_flops=NaN, flops_source="none", gpu={}, alloc0=NaN, warmup=False, counted=False,
                         traced=False, left=False, error=None)
    assert framework["step"] == 41   # the framework's own step number wins over the row's index


def test_which_rows_carry_speeds():
    assert speeds_measured(_row())
    for flag in ("warmup", "counted", "traced", "left"):
        assert not speeds_measured(_row(**{flag: True})), flag
    assert not speeds_measured(_row(error="RuntimeError: boom"))


def test_amounts_given_beat_read_and_unknown_means_none():
    assert amounts(None, None, None, None, 512, 4, False) == (512, 4, False)       # read from the inputs
    assert amounts(128, None, None, None, 512, 4, False) == (128, None, True)      # the step's own
    assert amounts(None, None, None, 16, 512, 4, False) == (None, 16, True)        # the Monitor's
    assert amounts(None, None, None, None, 512, 4, "a dict input") == (None, None, False)   # no guess


def test_model_flops_shape_count_or_given():
    # two forward calls of 1e6 FLOPs per token, 100 and 50 tokens: 1e6 x 150 = 1.5e8
    assert model_flops_of(None, [1e6, 1e6], [100, 50], 2e8, 1.8e8) == (1.5e8, MFU_ANALYTIC, False)
    # the shape says more than ran (frozen weights): the count's model FLOPs
    assert model_flops_of(None, [1e6], [100], 0.5e8, 0.4e8) == (0.4e8, MFU_COUNTED, True)
    assert model_flops_of(None, [None], [100], None, None)[1:] == (None, False)       # unknown shape, no count
    assert math.isnan(model_flops_of(None, [], [], None, None)[0])
    assert model_flops_of(7e9, [1e6], [100], None, None) == (7e9, "given (model_flops=)", False)


def test_windows_and_errors():
    assert not window_due(10.0, 10.1) and window_due(10.0, 10.25) and window_due(10.0, 10.01, last=True)
    rows = [_row(), _row()]
    window_figures(rows, "quiet", 3e9, 2e9)
    assert [(r["machine"], r["cpu_peak_bytes"], r["cpu_rss_bytes"]) for r in rows] == [("quiet", 3e9, 2e9)] * 2
    assert error_text(ValueError("bad batch")) == "ValueError: bad batch"
    assert error_text(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert error_text("left") == "left" and error_text(None) is None
