"""Conditions: what else used the machine while a figure was measured (issue 18).

The verdict is a pure function of counters, tested on exact readings; the meters are tested on
injected counter samples, so no test here depends on how busy the machine running it is.
"""
import math
import os

import pytest

from tunekit.core.conditions import BUSY, QUIET, UNKNOWN, Conditions, combine, judge
from tunekit.measure import conditions as mc


def test_quiet_when_nothing_waited_and_nobody_else_ran():
    # 1 s on 2 CPUs: 5 ms of CPU wait = 0.5%; the machine's busy time 2.02 s - our 2.00 s = 0.02 CPUs
    c = judge(1.0, 2, 2, cpu_wait_s=0.005, wait_source="psi", busy_cpu_s=2.02, own_cpu_s=2.0, steal_s=0.0)
    assert c.verdict == QUIET
    assert c.cpu_wait == pytest.approx(0.005) and c.others_cpus == pytest.approx(0.02)
    assert c.cpu_share == pytest.approx(1.0)           # 2.0 s / (1 s x 2 threads)
    assert c.steal == 0.0
    # a level that rounds to 0 keeps two significant digits (core.fmt.fmt_pct): 0.005 -> "0.50%"
    assert c.reason == "tasks waited for a CPU 0.50% of the time; other processes used 0.02 CPUs"


def test_busy_from_two_spinning_processes():
    # readings taken beside two `while True` loops: our 2-thread step got 1 CPU of 2
    c = judge(1.0, 2, 2, cpu_wait_s=0.97, wait_source="psi", busy_cpu_s=2.0, own_cpu_s=1.0)
    assert c.busy and c.verdict == BUSY
    assert c.others_cpus == pytest.approx(1.0)          # (2.0 - 1.0) s / 1 s
    assert c.cpu_share == pytest.approx(0.5)            # 1.0 / (1 x 2)
    assert c.reason == ("tasks waited for a CPU 97% of the time; other processes used 1.0 of 2 CPUs; "
                        "this process got 50% of its 2 threads' time")
    assert str(c).startswith("busy: tasks waited")


def test_short_block_judged_by_the_wait_alone():
    # 30 ms is below /proc/stat's resolution on 2 CPUs (10 x 10 ms x 2 = 0.2 s): others is not used
    c = judge(0.030, 2, 2, cpu_wait_s=0.029, wait_source="psi", busy_cpu_s=0.06, own_cpu_s=0.0)
    assert c.verdict == BUSY and "other processes" not in c.reason
    # ... and a 1 ms wait in a 3 ms cell is one scheduler tick, not a busy machine (< CPU_WAIT_MIN_S)
    assert judge(0.003, 2, 2, cpu_wait_s=0.001, wait_source="psi").verdict == QUIET


def test_own_threads_queueing_is_not_a_busy_machine():
    # 8 torch threads on 2 CPUs wait 60% of the time while no other process ran (others 0.0)
    c = judge(1.0, 2, 8, cpu_wait_s=0.6, wait_source="psi", busy_cpu_s=2.0, own_cpu_s=2.0)
    assert c.verdict == QUIET
    assert "own threads" in c.reason


def test_steal_and_gpu_make_it_busy():
    # steal: 0.2 s of 2 CPU-seconds = 10% >= 5%
    assert "steal" in judge(1.0, 2, 1, busy_cpu_s=0.5, own_cpu_s=0.5, steal_s=0.2).reason
    c = judge(1.0, 2, 1, gpu_other_processes=2, gpu_throttle=("sw power cap",))
    assert c.busy and c.reason == "2 other processes on the GPU"
    c = judge(1.0, 2, 1, gpu_other_processes=0, gpu_throttle=("hw thermal",))
    assert c.busy and c.reason == "GPU clocks slowed (hw thermal)" and c.gpu_throttle == "hw thermal"
    # a power cap under full load is the workload's own limit: recorded, not busy
    assert judge(1.0, 2, 1, gpu_other_processes=0, gpu_throttle=("sw power cap",)).verdict == QUIET


def test_unknown_without_counters_and_no_time():
    assert judge(0.01, 2, 1).verdict == UNKNOWN          # no wait counter, too short for /proc/stat
    assert judge(math.nan).verdict == UNKNOWN
    assert judge(0.0).reason == "no time was measured"


def test_ranks_of_one_run_are_not_each_others_other_processes():
    # two ranks on one 2-CPU machine, 1 s, 1 CPU-second each: the machine was busy 2.0 s
    alone = judge(1.0, 2, 1, busy_cpu_s=2.0, own_cpu_s=1.0)
    assert alone.busy                                  # judged alone, the other rank looks like load
    grouped = judge(1.0, 2, 1, busy_cpu_s=2.0, own_cpu_s=1.0, group_cpu_s=2.0)
    assert grouped.verdict == QUIET and grouped.others_cpus == 0.0 and grouped.cpu_share == 1.0


def test_combine_busy_if_any_and_worst_readings():
    q = judge(1.0, 2, 1, cpu_wait_s=0.0, wait_source="psi")
    b = judge(1.0, 2, 1, cpu_wait_s=0.5, wait_source="psi")
    c = combine([q, b], ["rank 0", "rank 1"])
    assert c.verdict == BUSY and c.reason == "1 of 2 busy: rank 1: tasks waited for a CPU 50% of the time"
    assert c.cpu_wait == 0.5 and c.wall_s == 2.0
    assert combine([q, q]).verdict == QUIET
    assert combine([]) is None and combine([None]) is None


def test_round_trip_through_a_log_line():
    c = judge(1.0, 2, 2, cpu_wait_s=0.97, wait_source="psi", busy_cpu_s=2.0, own_cpu_s=1.0)
    d = c.to_dict()
    assert Conditions.from_dict(d) == c
    assert Conditions.from_dict({"verdict": "busy", "reason": "x", "extra": 1}).verdict == BUSY
    for junk in ({"verdict": "maybe"}, "busy", 3, ["busy"]):
        assert Conditions.from_dict(junk) is None


# --- the meter, on injected counters --------------------------------------------------------------


def _fake(monkeypatch, samples, asked=None):
    it = iter(samples)

    def sample(with_sched, with_stat=True, with_wait=True):
        s = dict(next(it))
        if asked is not None:
            asked.append(with_stat if with_wait else (with_stat, "no wait"))
        if not with_stat:  # /proc/stat left unread
            s.pop("busy_s", None), s.pop("steal_s", None)
        if not with_wait:  # the CPU-wait counter left unread
            s.pop("wait_s", None), s.pop("wait_source", None)
        return s

    monkeypatch.setattr(mc._COUNTERS, "sample", sample)


def test_meter_turns_counter_deltas_into_a_verdict(monkeypatch):
    _fake(monkeypatch, [
        {"own_cpu_s": 10.0, "wait_s": 100.0, "wait_source": "psi", "busy_s": 500.0, "steal_s": 1.0},
        {"own_cpu_s": 11.0, "wait_s": 100.9, "wait_source": "psi", "busy_s": 502.0, "steal_s": 1.0},
    ])
    monkeypatch.setattr(mc, "_CPUS", 2)
    m = mc.ConditionsMeter().start()
    c = m.stop(1.0, threads=2)
    assert m.raw == {"own_cpu_s": 1.0, "cpu_wait_s": pytest.approx(0.9), "wait_source": "psi",
                     "busy_cpu_s": 2.0, "steal_s": 0.0}
    assert c.busy and c.others_cpus == pytest.approx(1.0)   # (502 - 500) - (11 - 10) over 1 s


def test_a_lean_meter_reads_proc_stat_at_stop_only_for_a_block_long_enough_for_its_ticks(monkeypatch):
    # 2 CPUs, 10 ms ticks: /proc/stat resolves blocks of >= 10 x 0.01 x 2 = 0.2 s
    monkeypatch.setattr(mc, "_CPUS", 2)
    monkeypatch.setattr(mc, "_TICK_S", 0.01)
    two = [{"own_cpu_s": 0.0, "wait_s": 0.0, "wait_source": "psi", "busy_s": 500.0, "steal_s": 1.0},
           {"own_cpu_s": 0.1, "wait_s": 0.0, "wait_source": "psi", "busy_s": 501.0, "steal_s": 1.0}]
    asked = []
    _fake(monkeypatch, two, asked)
    m = mc.ConditionsMeter(lean=True).start()
    c = m.stop(0.1, threads=1)  # 0.1 s < 0.2 s: the stop leaves /proc/stat unread
    assert asked == [True, False]
    assert "busy_cpu_s" not in m.raw and "steal_s" not in m.raw
    assert c.verdict == QUIET and math.isnan(c.others_cpus) and math.isnan(c.steal)
    assert c.cpu_wait == 0.0  # PSI is read at both ends: 0 s waited of 0.1 s
    with pytest.raises(ValueError):
        m.follow()
    asked.clear()
    _fake(monkeypatch, two, asked)
    m = mc.ConditionsMeter(lean=True).start()
    c = m.stop(0.2, threads=1)  # resolved: read, as a plain meter does
    assert asked == [True, True] and m.raw["busy_cpu_s"] == 1.0
    assert c.others_cpus == pytest.approx(4.5)  # (501 - 500 - 0.1) CPU-s over 0.2 s


def test_a_lean_meter_leaves_the_wait_unread_for_a_block_too_short_to_be_busy_by_it(monkeypatch):
    # CPU_WAIT_MIN_S = 2 ms: a 1 ms block cannot wait 2 ms, so its stop reads no PSI (nor /proc/stat:
    # 1 ms < 0.2 s); a plain meter reads both whatever the length
    monkeypatch.setattr(mc, "_CPUS", 2)
    monkeypatch.setattr(mc, "_TICK_S", 0.01)
    two = [{"own_cpu_s": 0.0, "wait_s": 0.0, "wait_source": "psi", "busy_s": 500.0, "steal_s": 1.0},
           {"own_cpu_s": 0.001, "wait_s": 0.001, "wait_source": "psi", "busy_s": 501.0, "steal_s": 1.0}]
    asked = []
    _fake(monkeypatch, two, asked)
    m = mc.ConditionsMeter(lean=True).start()
    c = m.stop(0.001, threads=1)
    assert asked == [True, (False, "no wait")]
    assert m.raw == {"own_cpu_s": 0.001, "wait_source": "psi"}  # the counter is there, unread
    assert c.verdict == QUIET and math.isnan(c.cpu_wait) and c.wait_source == "psi"
    assert c.reason == "CPU wait not read: a block under 2 ms is never busy by it"
    assert math.isnan(c.load_avg)  # not read either: it never decides
    asked.clear()
    _fake(monkeypatch, two, asked)
    c = mc.ConditionsMeter(lean=True).start().stop(0.002, threads=1)  # 2 ms: the wait can decide
    assert asked == [True, False] and c.cpu_wait == 0.5  # 1 ms of 2 ms; < CPU_WAIT_MIN_S: quiet
    assert c.verdict == QUIET and not math.isnan(c.load_avg)
    asked.clear()
    _fake(monkeypatch, two, asked)
    mc.ConditionsMeter().start().stop(0.001, threads=1)
    assert asked == [True, True]


@pytest.mark.skipif(not os.path.exists("/proc/pressure/cpu"), reason="Linux PSI")
def test_a_lean_meter_parses_what_it_read_only_when_the_stop_reads_it_too(monkeypatch):
    # the start keeps PSI's and /proc/stat's bytes; a short block's stop reads neither, so nothing
    # is parsed; a block long enough for /proc/stat's ticks parses both files at both ends
    monkeypatch.setattr(mc, "_CPUS", 2)
    monkeypatch.setattr(mc, "_TICK_S", 0.01)  # resolved from 10 x 0.01 x 2 = 0.2 s
    parsed = []
    real = mc._cooked
    monkeypatch.setattr(mc, "_cooked", lambda s: parsed.append(sorted(k for k in s if k.startswith("_"))) or real(s))
    short = mc.ConditionsMeter(lean=True).start()
    short.stop(0.001, threads=1)  # under 2 ms: neither PSI nor /proc/stat at the stop
    assert parsed == [] and short.raw["wait_source"] == "psi" and "cpu_wait_s" not in short.raw
    long_ = mc.ConditionsMeter(lean=True).start()
    c = long_.stop(0.2, threads=1)
    assert parsed == [["_psi", "_stat"], ["_psi", "_stat"]]  # start, stop
    assert {"cpu_wait_s", "busy_cpu_s"} <= set(long_.raw) and not math.isnan(c.others_cpus)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc/stat")
def test_a_meter_started_without_the_machines_counters_reads_them_at_neither_end(monkeypatch):
    monkeypatch.setattr(mc, "_CPUS", 2)
    monkeypatch.setattr(mc, "_TICK_S", 0.01)
    files = []
    real = mc._COUNTERS.read
    monkeypatch.setattr(mc._COUNTERS, "read", lambda name: files.append(name) or real(name))
    m = mc.ConditionsMeter(lean=True).start(machine=False)
    c = m.stop(0.5, threads=1)  # long enough for /proc/stat's ticks, but its start was not read
    assert "stat" not in files and "busy_cpu_s" not in m.raw
    assert math.isnan(c.others_cpus) and math.isnan(c.steal) and c.verdict != UNKNOWN  # the wait still judges


def test_an_unread_wait_is_said_so_only_where_it_could_not_decide():
    # judged from raw readings: a counter named (wait_source) without a reading
    assert judge(0.0001, 2, 1, wait_source="psi").reason == "CPU wait not read: a block under 2 ms is never busy by it"
    # the GPU still decides a short block
    assert judge(0.0001, 2, 1, wait_source="psi", gpu_other_processes=1).verdict == BUSY
    # 2 ms and more without a reading, or no counter at all: unknown, as before
    assert judge(0.002, 2, 1, wait_source="psi").verdict == UNKNOWN
    assert judge(0.0001, 2, 1).verdict == UNKNOWN


def test_meter_without_psi_falls_back_to_this_threads_wait(monkeypatch):
    _fake(monkeypatch, [{"own_cpu_s": 0.0, "wait_s": 0.0, "wait_source": "schedstat"},
                        {"own_cpu_s": 0.05, "wait_s": 0.04, "wait_source": "schedstat"}])
    c = mc.ConditionsMeter().start().stop(0.05, threads=1)
    assert c.busy and c.wait_source == "schedstat"
    assert c.reason.startswith("this thread waited for a CPU 80% of the time")   # 0.04 / 0.05


def test_real_counters_are_read_here():
    # this machine is Linux with PSI or schedstat: the meter gives a verdict, not 'unknown'
    c = mc.ConditionsMeter().start().stop()
    assert c.verdict in (QUIET, BUSY) and c.wait_source in ("psi", "schedstat")
    assert c.cpus and c.threads >= 1


def test_a_kept_file_closed_under_the_reader_is_opened_again_and_read():
    counters = mc._Counters()
    before = counters.read("stat")
    assert before.startswith(b"cpu ")  # /proc/stat: every Linux has it
    old = counters.fds["stat"]
    os.close(old)  # as code that closes every descriptor would
    after = counters.read("stat")
    assert after is not None and after.startswith(b"cpu ")
    assert counters.fds["stat"] != old or os.fstat(counters.fds["stat"]).st_ino == counters.ids["stat"][1]
    for fd in counters.fds.values():
        os.close(fd)


def test_a_kept_file_that_refuses_a_read_is_not_opened_again_nor_closed():
    # the descriptor is still the file opened (same device and inode): the file itself refused
    # (here a directory stands in: pread gives EISDIR), so nothing is reopened and nothing leaks
    counters = mc._Counters()
    counters._open()
    d = os.open("/proc", os.O_RDONLY)
    try:
        st = os.fstat(d)
        counters.fds["stat"], counters.ids["stat"] = d, (st.st_dev, st.st_ino)
        counters.args.pop("stat", None)  # read through os.pread (the libc path gives the same answer)
        assert counters.read("stat") is None
        assert counters.fds["stat"] == d
        os.fstat(d)  # still open: not closed by the reader
    finally:
        os.close(d)
        for name, fd in counters.fds.items():
            if name != "stat":
                os.close(fd)


def test_a_deferred_verdict_keeps_its_readings_without_a_dict_of_its_own_until_judged():
    import gc

    kw = dict(wall_s=1e-5, cpus=2, threads=1, tick_s=0.01, load_avg=None, own_cpu_s=1e-5, wait_source="psi")
    cond = mc.Deferred(kw)
    # what the garbage collector tracks of it: the object alone (its readings inline, their
    # dict holds only numbers and strings, which it does not track)
    assert [o for o in gc.get_referents(cond) if gc.is_tracked(o) and not isinstance(o, type)] == []
    assert cond.verdict == QUIET and type(cond) is Conditions  # judged when first read
    assert cond == judge(**kw)


def test_throttle_words():
    assert mc.throttle_words(0x48) == ("hw slowdown", "hw thermal")   # 0x08 | 0x40
    assert mc.throttle_words(0x24) == ("sw power cap", "thermal")     # 0x04 | 0x20 (sw thermal)
    assert mc.throttle_words(0) == ()


def test_gpu_readings_from_a_mocked_nvml(monkeypatch):
    import types

    from tunekit.measure import nvml

    me = mc.os.getpid()
    fake = types.SimpleNamespace(
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=p) for p in (me, 111, 222)],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x40)
    monkeypatch.setattr(nvml, "library", lambda: fake)
    monkeypatch.setattr(nvml, "handle", lambda i: object())
    # 111 is a sibling rank of the same run: not 'another process'
    assert mc.gpu_readings(0, exclude_pids=[111]) == {"gpu_other_processes": 1, "gpu_throttle": ("hw thermal",)}
    assert mc.gpu_readings(None) == {}


def test_ranks_conditions_groups_by_host():
    from tunekit.parallel.aggregate import ranks_conditions

    def reading(own, host="a"):
        return {"wall_s": 1.0, "host": host, "cpus": 2, "threads": 1, "load_avg": 0.5, "gpu": {},
                "raw": {"own_cpu_s": own, "busy_cpu_s": 2.0, "cpu_wait_s": 0.0, "wait_source": "psi"}}

    # two ranks on one machine used its 2 CPUs between them: quiet
    assert ranks_conditions([reading(1.0), reading(1.0)]).verdict == QUIET
    # on two machines each saw 2.0 CPU-s busy but only 1.0 of its own: 1 CPU of others on each
    c = ranks_conditions([reading(1.0, "a"), reading(1.0, "b")])
    assert c.verdict == BUSY and c.reason.startswith("2 of 2 busy: rank 0: other processes used 1.0 of 2 CPUs")


# --- where a person reads it -------------------------------------------------------------------------

BUSY_NOW = judge(1.0, 2, 2, cpu_wait_s=0.97, wait_source="psi", busy_cpu_s=2.0, own_cpu_s=1.0)


@pytest.fixture
def busy(monkeypatch):
    """Every meter reports the machine busy (two spinning processes), whatever it really is."""
    monkeypatch.setattr(mc.ConditionsMeter, "stop", lambda self, wall_s=None, threads=None: BUSY_NOW)


def test_a_busy_profiled_block_says_so_everywhere(busy):
    import tunekit
    from tunekit.core.summary import Summary, to_html, to_line, to_text

    with tunekit.profile(name="blk", flops="never") as rec:
        sum(range(1000))
    assert rec.conditions is BUSY_NOW
    assert "⚠ busy machine" in to_text(rec).splitlines()[0]
    assert "machine    BUSY: tasks waited for a CPU 97%" in to_text(rec)
    assert to_line(rec).startswith("⏱ blk · ⚠ busy machine")
    assert "class='tk-busy'" in to_html(rec) and "class='tk-busy'" in Summary(rec, compact=False)._repr_html_()
    row = tunekit.history(all=True).iloc[-1]
    assert row["conditions"] == "busy" and row["conditions_reason"].startswith("tasks waited")
    assert "tk-busy" in tunekit.history()._repr_html_()      # the readable table's badge


def test_a_quiet_block_carries_no_badge(monkeypatch):
    import tunekit
    from tunekit.core.summary import to_html, to_line

    quiet = judge(1.0, 2, 2, cpu_wait_s=0.0, wait_source="psi")
    monkeypatch.setattr(mc.ConditionsMeter, "stop", lambda self, wall_s=None, threads=None: quiet)
    with tunekit.profile(name="q", flops="never") as rec:
        pass
    assert "busy" not in to_line(rec) and "tk-busy" not in to_html(rec)


def test_a_busy_lab_run_says_so_in_results_cli_and_report(busy, tmp_path, make_lab):
    import tunekit
    from tunekit.cli.report_html import runs_report
    from tunekit.core.run_text import summary_lines

    lab = make_lab()
    r = lab.run(steps=1, warmup=0)
    assert r.conditions == BUSY_NOW
    assert summary_lines(r)[0].endswith("⚠ BUSY MACHINE")
    assert any(line.startswith("  machine  busy: tasks waited") for line in summary_lines(r))
    df = lab.results()
    assert df["conditions"].tolist() == ["busy"] and "tk-busy" in df._repr_html_()
    page = runs_report(lab.runs, tmp_path / "r.html").read_text()
    assert "⚠ busy machine</b>: 1 of 1 measurements" in page and "tk-busy" in page
    # read back from the log, the conditions are a Conditions again, readings and all
    again = tunekit.Lab.load_results(tmp_path / "runs.jsonl")
    assert again.iloc[-1]["conditions"] == "busy"


def test_combine_says_a_repeated_reason_once():
    b = judge(1.0, 2, 1, cpu_wait_s=0.5, wait_source="psi")
    assert combine([b, b, b]).reason == "3 of 3 busy: tasks waited for a CPU 50% of the time"


def test_one_thread_reads_as_english():
    c = judge(1.0, 2, 1, cpu_wait_s=0.9, wait_source="psi", busy_cpu_s=2.0, own_cpu_s=0.5)
    assert c.reason.endswith("this process got 50% of its 1 thread's time")
