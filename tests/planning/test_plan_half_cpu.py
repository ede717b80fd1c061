"""A CPU plan's half-precision elementwise ops (issue 42 item 3): ATen's CPU kernels compute bf16/fp16
elements in fp32 vectors, so such an op is timed at its fp32 twin's bytes (core.expected.fp32_width),
not at half of them; a GPU's, a matmul's and an fp32 op's bytes stay as counted."""
import pytest

from tunekit.core.efficiency import Figures
from tunekit.core.expected import fp32_width, op_seconds


def _fig(**kw):
    base = dict(name="toy", peak_tflops=1.0, mamf_tflops=0.5, mamf_source="m", bandwidth_tbs=0.05,
                bandwidth_source="b", launch_s=4e-6, launch_source="l", host_bound=True)
    return Figures(**{**base, **kw})


# a bf16 mul of 2^18 elements: two inputs read, one output written, 2 bytes each: 3 x 2^19 = 1.5 MiB
MUL16 = ("mul", "memory", "forward", 0, 3 * 2**19, None, 2)
MUL32 = ("mul", "memory", "forward", 0, 3 * 2**20, None, 4)   # its fp32 twin: 3 MiB


def test_a_bf16_elementwise_op_on_a_cpu_takes_its_fp32_twins_time():
    s16, bound, _ = op_seconds(_fig(), MUL16, None)
    s32, _, _ = op_seconds(_fig(), MUL32, None)
    # 1.5 MiB x 4 / 2 = 3 MiB at 0.05 TB/s: 3 x 2^20 / 5e10 = 6.291e-5 s, the fp32 mul's
    assert s16 == pytest.approx(3 * 2**20 / 5e10) == s32 and bound == "memory"


def test_a_gpus_half_op_and_a_cpus_matmul_keep_their_bytes():
    s, _, _ = op_seconds(_fig(host_bound=False), MUL16, None)
    assert s == pytest.approx(3 * 2**19 / 5e10)   # 1.5 MiB / 0.05 TB/s = 3.146e-5 s
    assert fp32_width(_fig(), "matmul", 100.0, 2) == 100.0   # a matmul's rate is its dtype's own sweep
    assert fp32_width(_fig(), "memory", 100.0, 4) == 100.0   # fp32 as counted
    assert fp32_width(_fig(), "memory", 100.0, 2) == 200.0   # 100 B x 4 / 2
