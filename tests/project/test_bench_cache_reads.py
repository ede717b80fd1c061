"""benchmarks/bench_cache_reads.py (issue 42, item 3): the states it sweeps, the growth ratios and the
cost of a faulted page, on fake timings (exact numbers); its ops' shapes and its fresh-page trial on
tiny tensors (what the trial computes, not how long it takes)."""
import pytest

from tests.helpers import load_script

MiB = 2**20


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_cache_reads.py")


def test_the_states_sweep_nothing_each_size_s_saved_bytes_and_four_last_level_caches(bench):
    sizes = [("a", 1024, 512, 128, 22.5 * MiB), ("b", 2048, 512, 128, 45 * MiB)]
    # 22.5 MiB = 23592960 bytes; 4 x 32 MiB = 134217728
    assert bench.states(sizes, 32 * MiB) == {"written": 0, "saved 22.5 MiB": 23592960, "saved 45.0 MiB": 47185920,
                                             "cold": 134217728}


def test_growth_alone_in_the_step_faulted_and_cold(bench):
    small, big = ("a", 1024, 512, 128, 0), ("b", 2048, 512, 128, 0)
    state_of = {1024: "saved 1", 2048: "saved 2"}
    best = {("op", 1024, "written", False): 1.0, ("op", 2048, "written", False): 1.9,
            ("op", 1024, "saved 1", False): 1.0, ("op", 2048, "saved 2", False): 2.2,
            ("op", 2048, "saved 2", True): 5.0,
            ("op", 1024, "cold", False): 1.25, ("op", 2048, "cold", False): 2.5}
    g = bench.growth(best, "op", small, big, state_of)
    # alone 1.9 / 1.0; in step 2.2 / 1.0; faulted: the big size's fresh 5.0 over the small one's reused 1.0;
    # cold 2.5 / 1.25
    assert g == pytest.approx({"alone": 1.9, "in step": 2.2, "in step, faulted": 5.0, "cold": 2.0})


def test_a_faulted_page_costs_fresh_less_reused_over_the_pages_of_the_output(bench):
    best = {("op", 1024, "written", True): 2.0e-3, ("op", 1024, "written", False): 0.5e-3}
    # a [1024 x 512] fp32 output: 2 MiB = 512 pages of 4 KiB; 1.5 ms / 512 = 2.9296875 us
    assert bench.us_per_page(best, "op", 1024, 1024 * 512 * 4) == pytest.approx(2.9296875)


def test_its_ops_read_or_write_the_wide_activation_and_a_fresh_trial_computes_the_same(bench):
    import torch

    ops = bench.ops_for(8, 16, 4)
    shapes = {name: shape for name, (_, shape, _) in ops.items()}
    assert shapes == {"gelu_backward": (8, 16), "mul": (8, 16), "mm [T,4C]@[4C,C]": (8, 4),
                      "mm [4C,T]@[T,C]": (16, 4), "mm [T,C]@[C,4C]": (8, 16)}
    operands, shape, fn = ops["mul"]
    pool = torch.ones(1024)
    for fresh in (False, True):
        t = bench.trial(operands, shape, fn, 1024, fresh, pool)
        assert t.run() >= 0.0
    # each trial's sweep added 1 to its 1024 bytes of the pool: 256 floats, twice
    assert pool[:256].tolist() == [3.0] * 256 and pool[256:].tolist() == [1.0] * 768
