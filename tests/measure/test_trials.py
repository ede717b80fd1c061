"""The arithmetic of a CPU calibration's repeatability (issue 39): a record's figures by name, their
spread over several calibrations (benchmarks/bench_calibration.py --spread), and the warm rounds
the compute figures are taken in. Fake trials only: no real timing is compared."""
import contextlib
import math
import types

import pytest

from tunekit.measure import step_compute, step_host, stream, trials


@pytest.fixture(autouse=True)
def _no_priority(monkeypatch):
    # the trials are fakes: nothing to run ahead of the machine's other work
    monkeypatch.setattr(trials, "ahead", contextlib.nullcontext)


def test_a_record_as_named_figures():
    entry = {"sweep": [(3 * 65536, 0.04), (3 * 2**20, 0.06)], "cold": [(3 * 65536, 0.02)], "op_s": 4e-6,
             "view_s": 2e-6, "module_s": 1e-6, "checkpoint_s": (8e-5, 1e-5), "gelu": {"fp32": 8e8},
             "attention": {"fp32": 0.04}, "matmuls": {"fp32": [(64, 0.03), (128, 0.1)]}}
    # bytes moved are 3n for n bytes per tensor: 3 x 65536 // 3 // 1024 = 64 KiB, 3 x 2^20 -> 1024 KiB
    assert stream.figures(entry) == {
        "sweep 64 KiB": 0.04, "sweep 1024 KiB": 0.06, "cold 64 KiB": 0.02, "op_s": 4e-6, "view_s": 2e-6,
        "module_s": 1e-6, "checkpoint_s segment": 8e-5, "checkpoint_s tensor": 1e-5, "gelu fp32": 8e8,
        "attention fp32": 0.04, "matmuls fp32 64": 0.03, "matmuls fp32 128": 0.1}


def test_spread_is_the_largest_over_the_smallest():
    assert trials.spread([0.12, 0.1, 0.15]) == pytest.approx(1.5)   # 0.15 / 0.1
    assert trials.spread([2.0]) == 1.0
    assert math.isnan(trials.spread([])) and math.isnan(trials.spread([0.0, 1.0]))   # no ratio of a zero


def test_spreads_over_records_keep_the_names_all_have():
    got = trials.spreads([{"x": 2.0, "y": 1.0}, {"x": 3.0, "y": 1.0, "z": 5.0}, {"x": 2.5, "y": 1.0}])
    assert got == {"x": 1.5, "y": 1.0}   # x: 3 / 2; y: 1 / 1; z is in one record only: left out
    assert trials.spreads([]) == {}


def test_faster_by_is_the_mean_share_each_figure_gained():
    # a: (2 - 1) / 2 = 0.5, b: (4 - 4) / 4 = 0: mean 0.25
    assert trials.faster_by({"a": 2.0, "b": 4.0}, {"a": 1.0, "b": 4.0}) == 0.25
    # a first round: inf before counts 1.0, b: (1 - 0.9) / 1 = 0.1: mean 0.55
    assert trials.faster_by({"a": math.inf, "b": 1.0}, {"a": 3.0, "b": 0.9}) == pytest.approx(0.55)
    assert trials.faster_by({}, {}) == 0.0


def test_rounds_go_on_while_a_round_finds_the_figures_faster():
    calls = []

    def trial():   # 1.0 s in the first round's 6 calls, 0.9 s ever after
        calls.append(1)
        return 1.0 if len(calls) <= 6 else 0.9

    # one round of a warm `fastest` with tries=2: timed trials 1, 2 (none faster: 1 in a row), 3 (2 in
    # a row: done), each after an untimed one: 6 calls. Round 1: 1.0; round 2: 0.9, 10% faster than
    # round 1 (>= 1%): a third; round 3: 0.9, 0% faster and at least 2 rounds done: stop. 3 x 6 calls.
    assert trials.rounds({"a": trial}, tries=2, least=2, most=4) == {"a": 0.9}
    assert len(calls) == 18


def test_rounds_stop_at_most_and_take_each_trial_in_turn():
    order = []

    def trial(name, seconds):
        def run():
            order.append(name)
            seconds[0] *= 0.5   # every call twice as fast: always faster, so only `most` stops it
            return seconds[0]
        return run

    a, b = [1.0], [1.0]
    got = trials.rounds({"a": trial("a", a), "b": trial("b", b)}, tries=1, least=1, most=2)
    # fastest(tries=1, warm) of a halving trial never has one in a row "none faster", so it runs to its
    # cap: max(MAX_TRIES, 3 x 1) = 60 timed trials, 120 calls, per trial and round; 2 rounds, a then b
    assert order == ["a"] * 120 + ["b"] * 120 + ["a"] * 120 + ["b"] * 120
    assert got == {"a": 0.5 ** 240, "b": 0.5 ** 240}


def test_compute_figures_are_flops_over_the_fastest_seconds():
    best = {("mm", "fp32", n, i): 1e-5 * (i + 1) for n in step_compute.MATMUL_SIZES for i in range(3)}
    best.update({("attention", "fp32"): 1e-3, ("gelu", "fp32"): 2e-3})
    matmuls, attention, gelu = step_compute.compute_figures(best, (("fp32", None),))
    # n = 64: 2 x 64^3 FLOPs x 3 layouts = 1,572,864 over 1e-5 + 2e-5 + 3e-5 = 6e-5 s: 2.62144e10 FLOP/s
    assert matmuls["fp32"][0] == (64, pytest.approx(0.0262144))
    assert [n for n, _ in matmuls["fp32"]] == list(step_compute.MATMUL_SIZES)
    # 7 b h s^2 d = 7 x 8 x 4 x 128^2 x 32 = 117,440,512 FLOPs in 1 ms: 0.117440512 TFLOPS
    assert attention == {"fp32": pytest.approx(0.117440512)}
    assert gelu == {"fp32": pytest.approx(2 * 2**20 / 2e-3)}   # forward + backward of 2^20 elements, per second


def test_matmul_trials_write_every_output_into_buffers_made_before_them(monkeypatch):
    import torch

    made, runs = [], []
    monkeypatch.setattr(step_compute, "timed", lambda fn, per=1: runs.append((fn, per)) or fn)
    real = step_compute._out_buffers
    monkeypatch.setattr(step_compute, "_out_buffers", lambda *a: made.append(real(*a)) or made[-1])
    step_compute._matmul_trials(64, torch.float32)
    (outs,) = made   # one set of buffers for the three layouts
    # 64-cubes: copies = min(16, ceil(2^23 / (2 x 64^2 x 4)) = 256) = 16; rounds = 2^24 // (64^3 x 16) = 4
    assert len(outs) == 16 * 4 and [per for _, per in runs] == [64] * 3
    for run, _ in runs:
        for o in outs:
            o.fill_(float("nan"))
        ptrs = [o.data_ptr() for o in outs]
        run()
        assert not any(o.isnan().any() for o in outs)   # every buffer written by its matmul
        assert [o.data_ptr() for o in outs] == ptrs     # in place: nothing allocated in a trial


def test_shape_figures_are_a_linear_layers_flops_over_the_fastest_seconds():
    best = {("shape", "fp32", "forward", 512, 128): 1e-4, ("shape", "fp32", "weight", 4096, 512): 2e-2,
            ("mm", "fp32", 64, 0): 1.0}
    # 2 x 512 x 128^2 = 16,777,216 FLOPs in 1e-4 s: 0.16777216 TFLOPS; 2 x 4096 x 512^2 = 2,147,483,648 in 2e-2 s
    assert step_compute.shape_figures(best) == {"fp32": [("forward", 512, 128, pytest.approx(0.16777216)),
                                                         ("weight", 4096, 512, pytest.approx(0.1073741824))]}


def test_shape_trials_run_a_linear_layers_three_matmuls_into_buffers_made_before_them(monkeypatch):
    import torch

    runs = []
    monkeypatch.setattr(step_compute, "timed", lambda fn, per=1: runs.append((fn, per)) or fn)
    trials = step_compute._shape_trials(64, 16, torch.float32)
    assert list(trials) == ["forward", "input", "weight"]
    # copies = min(16, ceil(2^23 / (2 x 64 x 16 x 4))) = 16; reps = 2^23 // (64 x 16^2 x 16) = 32: 512 matmuls
    assert [per for _, per in runs] == [512] * 3
    for (run, _), shape in zip(runs, ((64, 16), (64, 16), (16, 16))):
        outs = run.__defaults__[1]
        assert {tuple(o.shape) for o in outs} == {shape}
        ptrs = [o.data_ptr() for o in outs]
        run()
        assert [o.data_ptr() for o in outs] == ptrs   # in place: nothing allocated in a trial


def _scripted(name, returns, calls):
    """A fake trial: each call logs ``name`` and returns the next of ``returns`` (its 'seconds')."""
    it = iter(returns)

    def run():
        calls.append(name)
        return next(it)

    return run


def test_a_round_runs_every_trial_in_turn_each_per_round_times_warm_ones_after_an_untimed_call():
    calls = []
    got = trials.interleaved({
        "a": trials.Trial(_scripted("a", [3.0, 1.0], calls)),
        # warm, 2 a round: untimed, timed, untimed, timed; an untimed call's 0.0 must never count
        "b": trials.Trial(_scripted("b", [0.0, 5.0, 0.0, 4.0, 0.0, 6.0, 0.0, 7.0], calls), per_round=2, warm=True),
        "c": trials.Trial(_scripted("c", [2.0, 2.5], calls)),
    }, least=2, most=2)
    assert trials.schedule({"a": trials.Trial(None), "b": trials.Trial(None, per_round=2)}) == ["a", "b", "b"]
    # round 1 then round 2, the same order: a, b (untimed, timed) x 2, c
    assert calls == ["a", "b", "b", "b", "b", "c"] * 2
    # a: min(3, 1) = 1 from round 2; b: timed 5, 4 (round 1), 6, 7 (round 2): 4; c: min(2, 2.5) = 2
    assert got == {"a": 1.0, "b": 4.0, "c": 2.0}


def test_interleaved_keeps_every_timed_seconds_in_order_and_the_fastest_wins_whichever_round():
    calls, times = [], {}
    got = trials.interleaved({"a": trials.Trial(_scripted("a", [0.9, 0.5, 0.7, 0.6], calls)),
                              "b": trials.Trial(_scripted("b", [0.2, 0.3, 0.1, 0.4], calls))},
                             least=4, most=4, times=times)
    assert times == {"a": [0.9, 0.5, 0.7, 0.6], "b": [0.2, 0.3, 0.1, 0.4]}
    assert got == {"a": 0.5, "b": 0.1}   # a's fastest in round 2, b's in round 3
    assert calls == ["a", "b"] * 4


def test_interleaved_goes_on_while_a_round_makes_the_figures_1_percent_faster():
    calls = []
    # round 1: inf -> 10, 1.0 faster; round 2: 10 -> 9, 10% (>= 1%: on, though `least` = 2 is done);
    # round 3: 9 -> 8.95, 0.56% < 1%: stop after 3 rounds (the 4th return is never asked for)
    got = trials.interleaved({"a": trials.Trial(_scripted("a", [10.0, 9.0, 8.95, 1.0], calls))}, least=2, most=6)
    assert got == {"a": 8.95} and len(calls) == 3
    # never slower, never 1% faster after round 1: `least` rounds exactly
    calls.clear()
    assert trials.interleaved({"a": trials.Trial(_scripted("a", [1.0] * 9, calls))}, least=3, most=6) == {"a": 1.0}
    assert len(calls) == 3
    # always 10% faster: `most` stops it
    calls.clear()
    got = trials.interleaved({"a": trials.Trial(_scripted("a", [0.9 ** i for i in range(9)], calls))}, least=1, most=4)
    assert len(calls) == 4 and got == {"a": pytest.approx(0.9 ** 3)}


def test_no_round_starts_after_the_time_cap_even_before_least(monkeypatch):
    clock = types.SimpleNamespace(now=0.0, perf_counter=lambda: clock.now)

    def tick(name):   # each timed trial takes 1 s on the fake clock
        def run():
            clock.now += 1.0
            return 1.0
        return trials.Trial(run)

    monkeypatch.setattr(trials, "time", clock)
    times: dict = {}
    # round 1 ends at 2 s (< 3: on), round 2 at 4 s (>= 3: stop), though least is 8
    trials.interleaved({"a": tick("a"), "b": tick("b")}, least=8, most=12, times=times, until=3.0)
    assert times == {"a": [1.0, 1.0], "b": [1.0, 1.0]}


def test_each_round_says_how_far_it_is():
    calls, said = [], []
    # 1.0 then 0.5 (50% faster: on), then 0.5 (0%: stop after round 3, least 2 done)
    trials.interleaved({"a": trials.Trial(_scripted("a", [1.0, 0.5, 0.5], calls))}, least=2, most=5, say=said.append)
    assert said == ["round 1 of 2 to 5", "round 2 of 2 to 5", "round 3 of 2 to 5"]
    said.clear()
    trials.interleaved({"a": trials.Trial(_scripted("a", [1.0, 1.0], calls))}, least=2, most=2, say=said.append)
    assert said == ["round 1 of 2", "round 2 of 2"]


def test_a_round_averages_the_figures_gains_so_one_slow_figure_does_not_decide():
    calls = []
    # round 2: a 1.0 -> 0.95 (5%), b 1.0 -> 1.0 (0%), c, d the same: mean 1.25% -> on; round 3: a 0.95 ->
    # 0.945 (0.53%), the rest 0%: mean 0.13% -> stop after 3 rounds. With 0.97 in round 2 instead (3%: a mean of
    # 0.75%), round 2 is the last
    a = _scripted("a", [1.0, 0.95, 0.945, 0.1], calls)
    same = {k: trials.Trial(_scripted(k, [1.0] * 4, calls)) for k in "bcd"}
    got = trials.interleaved({"a": trials.Trial(a), **same}, least=2, most=6)
    assert got == {"a": 0.945, "b": 1.0, "c": 1.0, "d": 1.0} and calls == ["a", "b", "c", "d"] * 3
    calls.clear()
    a = _scripted("a", [1.0, 0.97, 0.5], calls)
    same = {k: trials.Trial(_scripted(k, [1.0] * 4, calls)) for k in "bcd"}
    assert trials.interleaved({"a": trials.Trial(a), **same}, least=2, most=6)["a"] == 0.97
    assert calls == ["a", "b", "c", "d"] * 2


def test_each_timed_trial_runs_ahead_of_the_load_with_its_untimed_one(monkeypatch):
    log = []

    @contextlib.contextmanager
    def ahead():
        log.append("raise")
        yield "realtime"
        log.append("lower")

    monkeypatch.setattr(trials, "ahead", ahead)
    trials.interleaved({"w": trials.Trial(_scripted("w", [0.0, 1.0], log), warm=True),
                        "c": trials.Trial(_scripted("c", [2.0], log))}, least=1, most=1)
    assert log == ["raise", "w", "w", "lower", "raise", "c", "lower"]
    assert trials.built(lambda x, y=1: log.append("made") or x + y, 2, y=3) == 5
    assert log[-3:] == ["raise", "made", "lower"]   # a trial's setup ahead of the load too


def test_a_tiny_trial_is_its_seconds_over_its_count_warmed_up_once(monkeypatch):
    clock, ran = [100.0], []

    def fn():   # 0.0101 s on the fake clock per call
        ran.append(1)
        clock[0] += 0.0101

    monkeypatch.setattr(step_host.time, "perf_counter", lambda: clock[0])
    t = step_host._tiny(fn, 101)
    assert len(ran) == 1   # warmed up once as it is made
    assert (t.per_round, t.warm) == (step_host.TINY_PER_ROUND, True)
    assert t.run() == pytest.approx(1e-4)   # 0.0101 s over 101 ops


def test_host_figures_from_the_fastest_seconds():
    best = {("sweep", n): 1e-4 for n in step_host.SIZES}
    best.update({("cold", n): 2e-4 for n in step_host.SIZES})
    best.update({("warm", n): 4e-4 for n in step_host.WARM_SIZES})
    best.update(op=4e-6, view=2e-6, module=1e-6)
    best.update({("checkpoint", 1, "checkpointed"): 0.004, ("checkpoint", 1, "plain"): 0.002,
                 ("checkpoint", 1, "forward"): 0.001, ("checkpoint", 20, "checkpointed"): 0.03,
                 ("checkpoint", 20, "plain"): 0.02, ("checkpoint", 20, "forward"): 0.0062})
    sweep, cold, warm, op_s, view_s, module_s, (segment, tensor) = step_host.host_figures(best)
    # 64 KiB: 3 x 65536 bytes moved in 1e-4 s = 1.96608 GB/s = 0.00196608 TB/s; cold in 2e-4 s: half
    assert sweep[0] == (3 * 65536, pytest.approx(0.00196608)) and cold[0] == (3 * 65536, pytest.approx(0.00098304))
    assert [m for m, _ in sweep] == [3 * n for n in step_host.SIZES] and len(warm) == len(step_host.WARM_SIZES)
    assert warm[0] == (3 * 65536, pytest.approx(0.00049152))   # in 4e-4 s
    assert (op_s, view_s, module_s) == (4e-6, 2e-6, 1e-6)
    # per segment at k=1: (0.004 - 0.002 - 0.001) / 20 = 5e-5; at k=20: (0.03 - 0.02 - 0.0062) / 20 = 1.9e-4;
    # per tensor (1.9e-4 - 5e-5) / 19 = 7.3684e-6; per segment 5e-5 - 7.3684e-6 = 4.2632e-5
    assert tensor == pytest.approx(1.4e-4 / 19) and segment == pytest.approx(5e-5 - 1.4e-4 / 19)
    # no L2-evicted sweep where sysfs lists no L2 (its trials absent): none
    assert step_host.host_figures({k: v for k, v in best.items() if k[0] != "warm"})[2] == []


def test_the_cold_trials_saved_tensors_are_slices_of_one_pool(monkeypatch):
    import torch

    pool = torch.full((2**16,), 1.0001)
    flush = torch.empty(16)
    t = step_host._cold_trial(2**14, flush, pool, ops=3)   # 4096 floats a tensor, 3 of them
    assert t.warm is False and step_host._cold_trial(2**14, flush, pool, ops=2, warm=True).warm is True
    saved = t.run.__closure__   # the trial's saved list: slices at 0, 4096 and 8192 floats of the pool
    (lst,) = [c.cell_contents for c in saved if isinstance(c.cell_contents, list)]
    assert [s.data_ptr() - pool.data_ptr() for s in lst] == [0, 4 * 4096, 8 * 4096]
    assert all(s.numel() == 4096 for s in lst)


@pytest.fixture
def two_threads():
    import torch

    was = torch.get_num_threads()
    torch.set_num_threads(2)
    yield torch
    torch.set_num_threads(was)


def test_a_small_cube_is_the_faster_of_torchs_threads_and_one(two_threads):
    torch, seen = two_threads, []

    def trial():   # a fake trial: 3 s on torch's 2 threads, 1 s on one (the slow state of issue 39)
        seen.append(torch.get_num_threads())
        return {2: 3.0, 1: 1.0}[seen[-1]]

    assert step_compute.or_one_thread(trial)() == 1.0   # min(3.0, 1.0)
    assert seen == [2, 1] and torch.get_num_threads() == 2   # timed on 2 threads, then 1; 2 put back

    def fast_on_two():
        return {2: 0.5, 1: 1.0}[torch.get_num_threads()]

    assert step_compute.or_one_thread(fast_on_two)() == 0.5   # min(0.5, 1.0): the threads' figure stays


def test_one_thread_is_undone_when_its_trial_fails(two_threads):
    torch = two_threads

    def trial():
        if torch.get_num_threads() == 1:
            raise KeyboardInterrupt
        return 1.0

    with pytest.raises(KeyboardInterrupt):
        step_compute.or_one_thread(trial)()
    assert torch.get_num_threads() == 2


def test_only_the_one_thread_sizes_take_a_one_thread_trial(monkeypatch):
    import torch

    wrapped = []
    monkeypatch.setattr(step_compute, "or_one_thread", lambda t: wrapped.append(t) or t)
    step_compute._matmul_trials(64, torch.float32)
    assert len(wrapped) == 3   # ONE_THREAD_SIZES = (64,): its three layouts
    step_compute._matmul_trials(128, torch.float32)
    assert len(wrapped) == 3 and step_compute.ONE_THREAD_SIZES == (64,)   # 128 not among them
