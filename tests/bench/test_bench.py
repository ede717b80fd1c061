"""Each microbenchmark at tiny sizes: well-formed results and a figure."""
import collections
import gc
import math
import os
import warnings

import plotly.graph_objects as go
import pytest
import torch

from tunekit import bench
from tunekit.bench import host
from tunekit.bench.compute import naive_softmax, softmax_traffic_bytes


def _well_formed(df, bench_name, n_rows):
    assert df.attrs["bench"] == bench_name and len(df) == n_rows
    ok = df["median_s"].notna()
    assert ((df["min_s"] <= df["median_s"]) & (df["median_s"] <= df["max_s"]))[ok].all()
    assert isinstance(bench.plot(df), go.Figure)


def test_forward_backward_ratio():
    df = bench.forward_backward_ratio(width=32, depth=2, tokens=16, micro_batch=1, seq_len=16,
                                      warmup=1, repeats=2)
    _well_formed(df, "forward_backward", 4)
    assert list(df["phase"]) == ["forward", "backward"] * 2
    bwd = df[df["phase"] == "backward"]
    assert (bwd["ratio"] > 0).all() and (df["repeats"] == 2).all()


def test_softmax_naive_matches_fused_and_traffic_model():
    x = torch.randn(4, 8)
    assert torch.allclose(naive_softmax(x), torch.softmax(x, -1), atol=1e-6)
    assert softmax_traffic_bytes(1000, 4, fused=True) == 8000     # 2 * 1000 * 4
    assert softmax_traffic_bytes(1000, 4, fused=False) == 32000   # 8 * 1000 * 4
    df = bench.softmax_naive_vs_fused(rows=64, cols=64, warmup=1, repeats=3)
    _well_formed(df, "softmax", 2)
    assert list(df["bytes_moved"]) == [8 * 64 * 64 * 4, 2 * 64 * 64 * 4]   # 131072, 32768


def test_swiglu_dff_search_candidates():
    df = bench.swiglu_dff_search(h=64, tokens=32, span=16, step=8, warmup=1, repeats=2)
    # 8/3*64 = 170.67 -> baseline 170; x64 192, x128 128, x256 256; every 8 in 152..184
    assert sorted(df["d_ff"]) == [128, 152, 160, 168, 170, 176, 184, 192, 256]
    assert df.loc[df["is_baseline"], "d_ff"].tolist() == [170]
    assert (df["mlp_params"] == 3 * 64 * df["d_ff"]).all()
    assert df["tflops"].is_monotonic_decreasing         # ranked fastest first
    _well_formed(df, "swiglu_dff", 9)


def test_matmul_shape_sweep():
    df = bench.matmul_shape_sweep("n", values=[16, 24, 32], m=16, k=16, warmup=1, repeats=2)
    _well_formed(df, "matmul_sweep", 3)
    # TFLOPS = 2*m*k*n / median / 1e12
    assert df["tflops"].tolist() == pytest.approx(list(2 * 16 * 16 * df["n"] / df["median_s"] / 1e12))
    with pytest.raises(ValueError):
        bench.matmul_shape_sweep("x")


class _RecordingDataset(host.SlowDataset):
    """SlowDataset that appends "<pid> <item>" to ``log`` for every item it loads (workers are
    forked: they inherit the class attribute)."""

    log = None

    def __getitem__(self, i):
        with open(self.log, "a") as f:   # one short O_APPEND write per line: lines never interleave
            f.write(f"{os.getpid()} {i}\n")
        return super().__getitem__(i)


def test_dataloader_workers(monkeypatch, tmp_path):
    monkeypatch.setattr(_RecordingDataset, "log", str(tmp_path / "loads.txt"))
    monkeypatch.setattr(host, "SlowDataset", _RecordingDataset)
    df = bench.dataloader_workers(num_workers=(0, 2), n_items=8, batch_size=2, transform_s=0.02,
                                  repeats=3)
    _well_formed(df, "dataloader_workers", 2)
    assert list(df["num_workers"]) == [0, 2] and df["times"].map(len).tolist() == [3, 3]
    assert df["median_s"].tolist() == [sorted(t)[1] for t in df["times"]]   # median of 3 passes
    assert df["speedup_vs_first"].tolist() == list(df["median_s"].iloc[0] / df["median_s"])
    # who loaded what, counted: 1 warm-up + 3 timed passes x 8 items = 32 loads per setting; with
    # 0 workers all in this process, with 2 in two persistent worker processes taking alternate
    # batches (4 batches of 2 a pass: 2 batches = 4 items each) -> 16 loads each
    pids = [int(line.split()[0]) for line in (tmp_path / "loads.txt").read_text().splitlines()]
    assert len(pids) == 64 and pids[:32] == [os.getpid()] * 32
    workers = collections.Counter(pids[32:])
    assert os.getpid() not in workers and sorted(workers.values()) == [16, 16]
    # a pass cannot beat its sleeps, however busy the machine (load only adds time): 0 workers
    # sleep 8 x 20 ms = 0.16 s one after another; with 2 the busiest worker sleeps 4 x 20 ms = 0.08 s
    assert min(df["times"].iloc[0]) >= 8 * 0.02 and min(df["times"].iloc[1]) >= 4 * 0.02


def test_pin_memory_without_cuda_is_nan_with_a_reason():
    if torch.cuda.is_available():
        pytest.skip("covered by the gpu test")
    df = bench.pin_memory_non_blocking()
    assert len(df) == 4 and df["median_s"].isna().all()
    assert "CUDA" in df.attrs["notes"][0]
    assert isinstance(bench.plot(df), go.Figure)


@pytest.mark.gpu
def test_pin_memory_on_gpu():
    df = bench.pin_memory_non_blocking(n_batches=4, batch_shape=(16, 256), repeats=2)
    _well_formed(df, "pin_memory", 4)
    assert df["median_s"].notna().all()


@pytest.mark.slow  # full gc.collect() passes over a process holding torch, pandas and IPython: 1.2-3.6 s
def test_gc_loop_restores_gc_state():
    was = gc.isenabled()
    df = bench.gc_in_training_loop(steps=5, garbage_per_step=100, width=16, collect_every=2, warmup=1)
    assert gc.isenabled() == was
    _well_formed(df, "gc", 2)
    assert (df["repeats"] == 5).all()


def test_compile_on_off_eager_backend():
    df = bench.compile_on_off(width=16, depth=1, tokens=8, backend="eager", warmup=1, repeats=2)
    _well_formed(df, "compile", 2)
    assert df["median_s"].notna().all() and df["compile_s"].iloc[1] > 0
    assert df["times"].map(len).tolist() == [2, 2]   # every repeat kept, for tunekit.verdict


def test_compile_failure_is_a_note_not_a_crash():
    df = bench.compile_on_off(width=16, depth=1, tokens=8, backend="no-such-backend", repeats=1)
    assert math.isnan(df["median_s"].iloc[1]) and "skipped" in df.attrs["notes"][0]
    assert df["times"].map(len).tolist() == [1, 0]   # the one eager repeat; nothing compiled


@pytest.mark.slow  # spawns two ranks that import torch and rendezvous over gloo: 4.5-11 s
def test_all_reduce_gloo_two_processes():
    sizes = (1024, 65536)
    df = bench.all_reduce_busbw(world_size=2, sizes_bytes=sizes, backend="gloo", warmup=1,
                                repeats=2, timeout_s=60)
    assert not df.attrs["notes"], df.attrs["notes"]
    _well_formed(df, "all_reduce", 2)
    # algbw = size / time; with 2 ranks busbw = algbw * 2*(2-1)/2 = algbw
    assert df["algbw_gb_per_s"].tolist() == pytest.approx(list(df["size_bytes"] / df["median_s"] / 1e9))
    assert df["busbw_gb_per_s"].tolist() == pytest.approx(df["algbw_gb_per_s"].tolist())
    with pytest.raises(ValueError):
        bench.all_reduce_busbw(sizes_bytes=(2**40,))


def test_numa_mask_decoding():
    assert host.cpus_from_mask([0b101, 1]) == [0, 2, 64]


def test_set_numa_affinity_degrades_with_a_note_not_a_warning():
    try:
        import pynvml
        pynvml.nvmlInit()
        pytest.skip("NVML works here; the no-op path is not reachable")
    except Exception:
        pass
    host._numa_notices.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert bench.set_numa_affinity(0) is None
        assert bench.set_numa_affinity(0) is None
    # no NVML GPU is an expected condition on a CPU machine: a neutral note, never a warning
    assert [w for w in caught if "set_numa_affinity" in str(w.message)] == []
    assert host.NUMA_NOTE["last"].startswith("set_numa_affinity: no NVML GPU")


class _FailingDataset(host.SlowDataset):
    def __getitem__(self, i):
        if i == 5:
            raise RuntimeError("bad item")
        return super().__getitem__(i)


def test_dataloader_workers_stopped_after_an_error(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(host, "SlowDataset", _FailingDataset)
    with pytest.raises(RuntimeError) as info:
        bench.dataloader_workers(num_workers=(2,), n_items=8, batch_size=2, transform_s=0.0,
                                 repeats=1)
    assert info.value is not None                  # the traceback is still alive here
    assert multiprocessing.active_children() == []


@pytest.mark.slow  # spawns two ranks that fail on nccl and are reaped: 4-10 s
def test_all_reduce_failure_is_reported_and_ranks_are_reaped():
    import psutil

    if torch.cuda.is_available():
        pytest.skip("nccl works here")
    df = bench.all_reduce_busbw(world_size=2, sizes_bytes=(1024,), backend="nccl", repeats=1,
                                timeout_s=20)
    assert "all-reduce failed" in df.attrs["notes"][0] and df["median_s"].isna().all()
    assert not [c for c in psutil.Process().children() if c.status() != psutil.STATUS_ZOMBIE]


def test_default_dtype_on_cpu_is_fp32():
    df = bench.matmul_shape_sweep("k", values=[8], m=8, n=8, warmup=0, repeats=1)
    assert "dtype=fp32" in df.attrs["notes"][0]
