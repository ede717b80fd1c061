"""The CPU step model's shape classes (issue 42): a linear layer's matmuls read from the measured
tall-skinny grid, and an op's inputs read from a core's cache, the last-level cache or memory by
their reuse distance. Pure: figures and op records in, seconds out."""
import math

import pytest

from tunekit.core.efficiency import Figures, grid_interpolated
from tunekit.core.expected import cache_level, expect, matmul_tflops, reuse_bytes, shape_class

GRID = (("forward", 512, 128, 0.10), ("forward", 4096, 128, 0.20),
        ("forward", 512, 512, 0.40), ("forward", 4096, 512, 0.40),
        ("weight", 512, 128, 0.05), ("weight", 4096, 128, 0.05),
        ("weight", 512, 512, 0.05), ("weight", 4096, 512, 0.05))


def _cpu(**kw):
    base = dict(name="cpu", peak_tflops=1.0, mamf_tflops=0.5, mamf_source="cube", bandwidth_tbs=None,
                bandwidth_source="hot", launch_s=0.0, launch_source="l", host_bound=True,
                mamf_sweep=((64, 0.3), (1024, 0.3)), bandwidth_sweep=((1, 0.1),), matmul_shapes=GRID,
                shape_source="shapes")
    return Figures(**{**base, **kw})


def test_a_linear_layers_matmuls_are_named_by_their_shape_class():
    # forward (tokens x in) @ (in x out): tokens m, features sqrt(k n) = sqrt(128 x 512) = 256
    assert shape_class((1024, 128, 512, 1), "forward") == ("forward", 1024, 256.0)
    # backward, reducing over the tokens (k the longest): the weight's gradient, features sqrt(m n)
    assert shape_class((512, 1024, 128, 1), "backward") == ("weight", 1024, 256.0)
    # backward into a tall output: the input's gradient
    assert shape_class((1024, 512, 128, 1), "backward") == ("input", 1024, 256.0)
    assert shape_class((1024, 32, 1024, 16), "forward") is None   # a batched matmul: attention's
    assert shape_class((1024, 128, 128, 1), None) is None


def test_the_grid_is_read_in_log_log_along_tokens_then_features():
    rows = [(t, f, r) for lay, t, f, r in GRID if lay == "forward"]
    # at 128 features: 0.1 at 512 tokens, 0.2 at 4096 (8x): at 1448.15 (2^1.5 x 512) 0.1 x 2^(1.5/3)
    assert grid_interpolated(rows, 512 * 2**1.5, 128) == pytest.approx(0.1 * 2**0.5)
    # then halfway between 128 and 512 features in log (256): the geometric mean of the two rates
    assert grid_interpolated(rows, 512, 256) == pytest.approx(math.sqrt(0.1 * 0.4))
    fig = _cpu()
    assert fig.shape_tflops("forward", 512, 128) == pytest.approx(0.1)
    assert fig.shape_tflops("input", 512, 128) is None        # a layout not measured
    assert fig.shape_tflops("forward", 8192, 128) is None     # outside the measured tokens: the cube sweep's
    assert fig.shape_tflops("forward", 1024, 1024) is None    # outside the measured features


def test_a_matmul_takes_its_shape_classes_rate_where_measured_else_the_cube_sweep():
    fig = _cpu()
    assert matmul_tflops(fig, (512, 128, 128, 1), 4, "forward") == (pytest.approx(0.1), "shapes")
    assert matmul_tflops(fig, (128, 512, 128, 1), 4, "backward") == (pytest.approx(0.05), "shapes")
    assert matmul_tflops(fig, (512, 128, 128, 1), 4, "backward") == (0.3, "cube")   # "input": not measured
    assert matmul_tflops(_cpu(matmul_shapes=()), (512, 128, 128, 1), 4, "forward") == (0.3, "cube")
    # in the step: 2 x 512 x 128 x 128 = 16,777,216 FLOPs at 0.1 TFLOPS = 1.6777216e-4 s (its bytes at
    # 0.1 TB/s: 3 x 65,536 x 4 = 786,432 B, 7.86e-6 s, fewer)
    mm = ("mm", "matmul", "forward", 2 * 512 * 128 * 128, 3 * 512 * 128 * 4, (512, 128, 128, 1), 4)
    e = expect([mm], fig, tokens=512, model_flops=0, backend=None, params=0, param_bytes=4, grad_bytes=4,
               state_bytes=0, optimizer_kernels=0)
    assert e.rows[0][3] == pytest.approx(1.6777216e-4) and e.rows[0][5] == "shapes"


def test_an_op_reads_from_a_cores_cache_the_last_level_or_memory_by_its_reuse_distance():
    a = ("a", "memory", "forward", 0, 10, None, 4, ((), ((1, 10),)))            # writes storage 1
    b = ("b", "memory", "forward", 0, 20, None, 4, (((1, 10),), ((2, 10),)))   # reads 1 right after: 0 B between
    c = ("c", "memory", "forward", 0, 100, None, 4, (((3, 50),), ((4, 50),)))  # 3: first read, a step ago
    d = ("d", "memory", "backward", 0, 20, None, 4, (((1, 10),), ((5, 10),)))  # 1 again (b touched it): c's 100 B
    # the step moves 10 + 20 + 100 + 20 = 150 bytes; a's inputs: none
    assert reuse_bytes([a, b, c, d]) == [0.0, 0.0, 150.0, 100.0]
    fig = _cpu(bandwidth_sweep=((1, 0.1),), cold_sweep=((1, 0.01),), warm_sweep=((1, 0.05),), cache_bytes=130,
               l2_bytes=30, cold_source="cold", warm_source="warm")
    # b: 0 B <= its L2 of 30: hot; c: 150 > 130: memory; d: 100 over both 30 and its own 20 B: the L3
    assert [cache_level(fig, r, x) for r, x in zip([a, b, c, d], reuse_bytes([a, b, c, d]))] == \
        ["hot", "hot", "cold", "warm"]
    # an op whose own bytes exceed the distance reads what the op before it wrote, as the hot chain does
    assert cache_level(fig, ("e", "memory", "forward", 0, 200, None, 4), 100) == "hot"
    assert cache_level(_cpu(cache_bytes=130), d, 100) == "hot"   # no warm sweep measured: as before
    rows = {r[0]: r for r in expect([a, b, c, d], fig, tokens=1, model_flops=0, backend=None, params=0,
                                    param_bytes=4, grad_bytes=4, state_bytes=0, optimizer_kernels=0).rows}
    # d: 20 B at 0.05 TB/s (the L3 sweep) = 4e-10 s; c: 100 B at 0.01 (memory) = 1e-8 s
    assert rows["d"][3] == pytest.approx(20 / 0.05e12) and rows["d"][5] == "warm"
    assert rows["c"][3] == pytest.approx(100 / 0.01e12) and rows["c"][5] == "cold"
    # never faster than in a core's cache: a warm sweep above the hot one reads as the hot one
    assert _cpu(warm_sweep=((1, 0.5),)).tbs_at(10, warm=True) == 0.1
