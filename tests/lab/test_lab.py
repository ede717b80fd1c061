"""The Lab: toggles really change the live model, measurements, JSONL log, OOM-safe search."""
import importlib.util
import json
import math
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tunekit.core.results import RunResult
from tunekit.core.toggles import FP16_ON_CPU, Env, ToggleError, Toggles, label, notices, problems
from tunekit.lab import runlog
from tunekit.lab.lab import Lab

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20


# `lab` (a fresh cpu-tiny Lab of 4 x 64) comes from conftest.py


# --- pure rules ---------------------------------------------------------------------------


def test_toggle_rules_explain_refusals():
    cpu = Env(device_type="cpu", block_size=128, unavailable_optimizers={"lion": "no package"})
    assert problems(Toggles(), cpu) == []
    assert problems(Toggles(precision="fp16"), cpu) == [FP16_ON_CPU]
    assert "CUDA" in problems(Toggles(attention="flash"), cpu)[0]
    assert "micro_batch" in problems(Toggles(micro_batch=0), cpu)[0]
    assert "position limit (128" in problems(Toggles(seq_len=256), cpu)[0]
    assert "no package" in problems(Toggles(optimizer="lion"), cpu)[0]
    gpu = Env(device_type="cuda", flash_installed=False)
    assert problems(Toggles(precision="fp16"), gpu) == []
    assert "fp16/bf16" in problems(Toggles(attention="flash"), gpu)[0]
    assert problems(Toggles(attention="flash", precision="bf16"), gpu) == []
    assert "falls back" in notices(Toggles(attention="flash", precision="bf16"), gpu)[0]
    assert "fp32 run" in notices(Toggles(precision="tf32"), cpu)[0]


def test_labels_name_what_changed():
    base = Toggles(seq_len=64, attention="sdpa")
    assert label(base, base) == "baseline"
    assert label(base.replace(precision="bf16", checkpointing=True, micro_batch=16), base) == "bf16 ckpt mb=16"
    with pytest.raises(TypeError, match="unknown toggle"):
        base.replace(batch_size=3)


def test_pure_modules_import_no_torch():
    code = textwrap.dedent("""
        import sys
        import tunekit.core.toggles, tunekit.lab.runlog
        assert "torch" not in sys.modules, "pure module imported torch"
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_bool_is_not_a_batch_size():
    # True == 1 for isinstance(int): a checkbox value must not become micro_batch=1
    assert "micro_batch" in problems(Toggles(micro_batch=True), Env())[0]
    assert "seq_len" in problems(Toggles(seq_len=False), Env())[0]


# --- runs ----------------------------------------------------------------------------------


def test_run_measures_and_caches_flops(lab):
    r = lab.run(steps=3, warmup=1)
    assert r.tokens_per_step == 4 * 64
    assert r.tokens_per_s == pytest.approx(256 / r.step_s)
    assert r.step_s_min <= r.step_s <= r.step_s_max
    assert r.flops_source == "counted" and r.flops_per_step > 0
    # analytic model FLOPs: (6N + 12*L*d*T/2) per token = (6*426624 + 6*2*128*64) * 256
    # one MFU convention: 6 x the matmul weights (2 layers x (4*128^2 + 2*128*512) + lm_head
    # 256*128 = 425984) + causal attention 12*L*h*s/2 = 6*2*128*64, per token, x 256 tokens
    assert r.model_flops_per_step == (6 * 425984 + 6 * 2 * 128 * 64) * 256 == 679477248
    assert r.mfu == pytest.approx(r.model_flops_per_step / r.step_s / 1e12)  # peak given: 1 TFLOPS
    assert r.hfu == pytest.approx(r.tflops)
    assert r.peak_mem_bytes > 0 and "RSS" in r.peak_mem_source
    # AdamW: exp_avg + exp_avg_sq in fp32, plus a 4-byte fp32 step counter per parameter
    # tensor (14: wte, 6 per block x 2, final norm) -> 8*426624 + 14*4 = 3413048
    assert r.optimizer_bytes == 3413048
    assert r.attention_ran == "sdpa" and r.compute_dtype == "fp32" and r.autocast_dtype is None
    again = lab.run(steps=2, warmup=0)
    assert again.flops_source == "cached" and again.flops_per_step == r.flops_per_step
    ga = lab.run(steps=2, warmup=0, grad_accum=2)
    assert ga.tokens_per_step == 512 and ga.flops_per_step == 2 * r.flops_per_step
    assert ga.label == "ga=2"


# not marked slow (25 steps of 4 x 64 tokens, seconds): the only test that training learns, kept in `make test`
def test_loss_falls_on_the_corpus(lab):
    r = lab.run(steps=25, warmup=0, lr=3e-3)
    assert r.loss_first == pytest.approx(math.log(256), abs=0.3)  # untrained: uniform over bytes
    assert r.loss < r.loss_first - 1.0  # 25 tiny steps: ~5.25 -> ~3.96


def test_checkpointing_reduces_saved_activations(lab):
    base = lab.run(steps=1, warmup=0)
    ckpt = lab.run(steps=1, warmup=0, checkpointing=True)
    assert lab.model.checkpointing is True
    assert ckpt.saved_bytes < 0.4 * base.saved_bytes
    # recomputation is executed work (HFU) but not model work (MFU)
    assert ckpt.flops_per_step > base.flops_per_step
    assert ckpt.model_flops_per_step == base.model_flops_per_step
    lab.run(steps=1, warmup=0)
    assert lab.model.checkpointing is False  # each run starts from the defaults


def test_a_hand_change_is_followed_and_a_given_toggle_over_it_says_so(lab):
    from tunekit.core.notes import of_kind

    lab.model.set_checkpointing(True)            # by hand, outside the Lab
    followed = lab.run(steps=1, warmup=0)        # checkpointing left out: the model as it was set
    assert followed.checkpointing is True and not of_kind(followed.notes, "toggle.over_hand_change")
    given = lab.run(steps=1, warmup=0, checkpointing=False)
    assert given.checkpointing is False and lab.model.checkpointing is False
    assert [n.kind for n in given.notes if getattr(n, "kind", None) == "toggle.over_hand_change"] == \
        ["toggle.over_hand_change"]
    again = lab.run(steps=1, warmup=0)           # left out again: back to the hand change, nothing to say
    assert again.checkpointing is True and not of_kind(again.notes, "toggle.over_hand_change")


def test_bf16_changes_autocast_dtype(lab):
    seen = []
    lab.model.blocks[0].mlp.up.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    r = lab.run(steps=1, warmup=0, precision="bf16")
    assert r.autocast_dtype == "bfloat16" and set(seen) == {torch.bfloat16}
    seen.clear()
    lab.run(steps=1, warmup=0)
    assert set(seen) == {torch.float32}


def test_tf32_on_cpu_is_recorded_as_fp32(lab):
    r = lab.run(steps=1, warmup=0, precision="tf32")
    assert r.precision == "tf32" and r.compute_dtype == "fp32"
    assert any("fp32 run" in n for n in r.notes)


def test_fused_adamw_is_used(lab, monkeypatch):
    calls = []
    real = torch._fused_adamw_
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: calls.append(1) or real(*a, **k))
    r = lab.run(steps=2, warmup=0, optimizer="adamw_fused")
    assert lab.optimizer.defaults["fused"] is True and len(calls) == 2
    assert r.optimizer == "adamw_fused"


@pytest.mark.parametrize("name,state_bytes", [("sgd", 4 * 426624), ("adafactor", None)])
def test_other_optimizers(lab, name, state_bytes):
    r = lab.run(steps=1, warmup=0, optimizer=name)
    assert type(lab.optimizer).__name__ == {"sgd": "SGD", "adafactor": "Adafactor"}[name]
    if state_bytes is not None:
        assert r.optimizer_bytes == state_bytes  # momentum buffer: 4 B per parameter


def test_refused_toggles_raise_with_explanation(lab):
    for kw, text in [({"precision": "fp16"}, "GradScaler"), ({"attention": "flash"}, "CUDA"),
                     ({"micro_batch": 0}, "micro_batch"), ({"steps": 0}, "steps")]:
        with pytest.raises(ToggleError, match=text):
            lab.run(**kw)
    if importlib.util.find_spec("lion_pytorch") is None:
        with pytest.raises(ToggleError, match="lion-pytorch"):
            lab.run(optimizer="lion")
    assert lab.results().empty


def test_custom_module(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    lab = Lab(net, batch_fn=lambda b, t: (torch.randn(b, 16), torch.randint(0, 4, (b,))),
              loss_fn=lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y),
              log_path=tmp_path / "r.jsonl", peak_tflops=1.0, micro_batch=8)
    r = lab.run(steps=2, warmup=0)
    # counted: forward 2*8*(16*32 + 32*4) = 10240, backward twice the weight grads + input grad
    # of the 2nd layer only: 2*8*(16*32+32*4) + 2*8*32*4 = 12288 -> 22528
    assert r.flops_per_step == 22528 and r.model_flops_per_step == 22528
    assert r.seq_len == 1 and r.attention is None
    with pytest.raises(ToggleError, match="no attention switch"):
        lab.run(attention="math")


# --- the log -------------------------------------------------------------------------------


def test_log_is_reloadable(lab):
    lab.run(steps=1, warmup=0)
    lab.run(steps=1, warmup=0, precision="bf16")
    lines = lab.log_path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["precision"] == "bf16"
    again = Lab(log_path=lab.log_path, peak_tflops=1.0)
    assert list(again.results()["label"]) == ["baseline", "bf16"]
    assert list(Lab.load_results(lab.log_path)["run_id"]) == [0, 1]
    assert isinstance(again.runs[0], RunResult) and again.runs[0].toggles.precision == "fp32"


def test_log_survives_crash_mid_write(tmp_path):
    path = tmp_path / "runs.jsonl"
    # a writer that finishes two records, then dies by SIGKILL half-way through the third line
    code = textwrap.dedent(f"""
        import os, signal
        from tunekit.lab import runlog
        runlog.append_record(r"{path}", {{"run_id": 0, "loss": float("nan")}})
        runlog.append_record(r"{path}", {{"run_id": 1, "loss": 2.5}})
        with open(r"{path}", "ab") as f:
            f.write(b'{{"run_id": 2, "lo'); f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT)
    assert proc.returncode == -signal.SIGKILL
    records, skipped = runlog.read_records(path)
    assert [r["run_id"] for r in records] == [0, 1] and skipped == 1
    assert records[0]["loss"] is None  # NaN is written as null: valid JSON
    runlog.append_record(path, {"run_id": 2})  # the next write starts on a fresh line
    records, skipped = runlog.read_records(path)
    assert [r["run_id"] for r in records] == [0, 1, 2] and skipped == 1


def test_log_from_another_version_still_loads(tmp_path, monkeypatch):
    # a record written by an older tunekit lacks newer fields: they load as None/NaN
    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path))
    path = tmp_path / "runs" / "lab-old.jsonl"
    runlog.append_record(path, {"run_id": 0, "label": "baseline", "tokens_per_s": 1000.0})
    lab = Lab(log_path=path, peak_tflops=1.0)
    assert lab.runs[0].tokens_per_s == 1000.0 and math.isnan(lab.runs[0].mfu)
    assert lab.runs[0].notes == [] and lab.runs[0].peak_mem_bytes is None
    assert list(Lab.load_results()["label"]) == ["baseline"]  # newest log under data/runs


def test_log_written_before_the_rename_reads_its_memory_peak_source(tmp_path):
    # RunResult.peak_source was renamed peak_mem_source (the TFLOPS peak's is peak_tflops_source)
    path = tmp_path / "old.jsonl"
    runlog.append_record(path, {"run_id": 0, "label": "baseline", "peak_source": "RSS (VmHWM)"})
    runlog.append_record(path, {"run_id": 1, "label": "bad", "peak_source": 3})  # the old key is checked too
    with pytest.warns(UserWarning, match="1 line"):
        (r,) = runlog.RunLog(path).runs
    assert r.peak_mem_source == "RSS (VmHWM)" and "peak_source" not in r.to_dict()


@pytest.mark.slow
def test_failed_run_leaves_no_gradients_or_meters(lab):
    from tunekit.measure import meters
    lab.run(steps=1, warmup=0)  # FLOP count cached: the next run goes straight to its steps
    real, calls = lab.batch_fn, []

    def flaky(b, t):
        calls.append(1)
        if len(calls) == 2:  # the second micro-step of grad_accum=2: after one backward
            raise RuntimeError("data loader died")
        return real(b, t)

    lab.batch_fn = flaky
    with pytest.raises(RuntimeError, match="loader died"):
        lab.run(steps=1, warmup=0, grad_accum=2)
    assert all(p.grad is None for p in lab.model.parameters())  # would leak into the next run
    assert meters._ACTIVE_CPU == []  # the peak meter was stopped, not left nested forever
    assert lab.run(steps=1, warmup=0).steps == 1


def test_fp16_grad_scaler_lives_with_the_optimizer(lab):
    from tunekit.core.toggles import Toggles
    fp16 = Toggles(precision="fp16")
    assert lab.grad_scaler(Toggles()) is None
    scaler = lab.grad_scaler(fp16)
    assert lab.grad_scaler(fp16) is scaler  # a fresh one per run would restart at 2**16
    lab.run(steps=1, warmup=0, optimizer="sgd")  # a new optimizer: a new scaler too
    assert lab.grad_scaler(fp16) is not scaler


# --- max batch search ------------------------------------------------------------------------


@pytest.mark.slow
def test_find_max_batch_on_cpu_budget_returns_to_baseline(lab):
    lab.run(steps=1, warmup=1)  # optimizer state exists, so the baseline includes it
    found = lab.find_max_batch_size(limit=64, memory_budget_bytes=40 * MiB, budget_s=None)  # no clock
    fits = [t for t in found.trials if t.fits]
    assert found.best is not None and found.best == max(t.micro_batch for t in fits)
    assert all(t.used_bytes <= 40 * MiB for t in fits)
    # the search ends next to a miss: best + 1 was tried (or predicted) and did not fit
    assert any(t.micro_batch == found.best + 1 and not t.fits for t in found.trials)
    assert [t.micro_batch for t in found.trials][:3] == [1, 2, 4]  # doubling first
    # RSS back near the baseline: the trials used up to 40 MiB; malloc keeps some freed pages in
    # its arenas (17 MiB once in a clean CI run, late in a long test session)
    assert found.after_bytes - found.baseline_bytes < 20 * MiB
    assert len(found.table()) == len(found.trials)


@pytest.mark.slow
def test_oom_trial_frees_memory(lab):
    lab.run(steps=1, warmup=0)
    real_step = lab.train_step

    def step(t):
        if t.micro_batch > 5:
            hog = torch.ones(64 * MiB // 4)  # 64 MiB alive in this frame when the OOM is raised
            hog += 1
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")
        return real_step(t)

    lab.train_step = step
    found = lab.find_max_batch_size(limit=64, memory_budget_bytes=1 << 40, budget_s=None)
    assert found.best == 5
    assert [t.micro_batch for t in found.trials] == [1, 2, 4, 8, 6, 5]
    assert found.trials[3].reason.startswith("OOM") and found.trials[3].used_bytes > 60 * MiB
    assert found.trials[3].reason.kind == "trial.oom" and found.trials[0].reason.kind == "trial.ok"
    # RSS back near the baseline: the trials used up to 40 MiB; malloc keeps some freed pages in
    # its arenas (17 MiB once in a clean CI run, late in a long test session)
    assert found.after_bytes - found.baseline_bytes < 20 * MiB  # the 64 MiB went back


def test_find_max_refuses_bad_toggles(lab):
    with pytest.raises(ToggleError):
        lab.find_max_batch_size(precision="fp16")
    for start, limit in [(0, 8), (1.5, 8), (4, 2), (1, "8")]:
        with pytest.raises(ToggleError, match="start"):
            lab.find_max_batch_size(start=start, limit=limit)


@pytest.mark.slow
def test_find_max_non_oom_error_propagates_cleanly(lab):
    from tunekit.measure import meters
    lab.run(steps=1, warmup=0)

    def step(t):
        lab.model(*lab.batch(t.micro_batch, t.seq_len))[1].backward()
        raise ValueError("a bug, not an OOM")

    lab.train_step = step
    with pytest.raises(ValueError, match="not an OOM"):
        lab.find_max_batch_size(limit=4)
    assert meters._ACTIVE_CPU == [] and all(p.grad is None for p in lab.model.parameters())


def test_flash_flops_added_analytically():
    from tunekit.measure.flops import FlopCount
    from tunekit.measure.step import ProbeResult, add_flash_flops
    from tunekit.models.gpt import GPTConfig

    cfg = GPTConfig.preset("cpu-tiny")  # L=2, nh=4, hs=32
    res = ProbeResult(FlopCount(executed=0), saved_bytes=0, attention_ran="flash")
    add_flash_flops(res, cfg, batch=2, seq_len=64, checkpointing=True)
    # forward 4*B*nh*T^2*hs = 4*2*4*64*64*32 = 4194304, halved (causal) x 2 layers = 4194304
    # backward 10*2*4*64*64*32 = 10485760, halved x 2 layers = 10485760; recompute = forward
    # of the backward's 10 units, 2 rebuild QK^T: 10485760 / 5 = 2097152 is not model work
    assert res.flops.executed == 4194304 + 10485760 + 4194304
    assert res.flops.recompute == 4194304 and res.flops.attention_recompute == 2097152
    assert res.flops.model == 4194304 + 10485760 - 2097152


def test_flash_flops_leave_the_counter_s_note_naming_the_ops_still_uncounted():
    # the counter's uncounted note is found by its kind (the words here are not the counter's)
    from tunekit.core.notes import Note
    from tunekit.measure.flops import FlopCount
    from tunekit.measure.step import ProbeResult, add_flash_flops
    from tunekit.models.gpt import GPTConfig

    cfg = GPTConfig.preset("cpu-tiny")
    said = ["kept", Note("flops.uncounted", "any words: flash_attn and aten.foo")]
    fc = FlopCount(uncounted_ops=["aten.foo", "flash_attn._flash_attn_forward"], notes=list(said))
    res = ProbeResult(fc, saved_bytes=0, attention_ran="flash", notes=list(said))
    add_flash_flops(res, cfg, batch=2, seq_len=64, checkpointing=False)
    assert res.flops.uncounted_ops == ["aten.foo"]
    assert res.flops.notes == ["kept", "not counted (no FLOP formula): aten.foo"]
    assert res.notes == ["kept", "not counted (no FLOP formula): aten.foo",
                         "added flash-attn FLOPs (torch's counter cannot see them): causal, analytic"]
    assert res.notes[1].kind == "flops.uncounted"
    # flash-attn's ops alone: no uncounted note is left
    fc = FlopCount(uncounted_ops=["flash_attn._flash_attn_forward"], notes=list(said))
    res = ProbeResult(fc, saved_bytes=0, attention_ran="flash", notes=list(said))
    add_flash_flops(res, cfg, batch=2, seq_len=64, checkpointing=False)
    assert res.flops.notes == ["kept"] and res.notes[:-1] == ["kept"]


# --- CUDA paths (skipped without a GPU; run them with the device tool) ------------------------


@pytest.mark.gpu
def test_cuda_run_restores_matmul_precision_and_measures(tmp_path):
    lab = Lab(device="cuda", log_path=tmp_path / "r.jsonl", peak_tflops=100.0, seq_len=64)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        r = lab.run(steps=2, warmup=1, precision="tf32")
        assert torch.get_float32_matmul_precision() == "medium"  # the user's flag came back
    finally:
        torch.set_float32_matmul_precision(before)
    assert r.compute_dtype == "tf32" and r.peak_mem_bytes > 0 and r.mfu > 0
    b = lab.run(steps=2, warmup=1, precision="bf16", optimizer="adamw_fused")
    assert b.autocast_dtype == "bfloat16" and lab.optimizer.defaults["fused"] is True


@pytest.mark.gpu
def test_cuda_oom_search_returns_to_baseline(tmp_path):
    lab = Lab(preset="cpu-small", device="cuda", log_path=tmp_path / "r.jsonl", peak_tflops=100.0)
    lab.run(steps=1, warmup=0)
    free_bytes, _ = torch.cuda.mem_get_info()
    hog = torch.empty(max(0, free_bytes - 2 * 2**30), dtype=torch.uint8, device="cuda")  # ~2 GiB left
    try:
        found = lab.find_max_batch_size(limit=4096, budget_s=None)
    finally:
        del hog
    assert any(t.reason.startswith("OOM") for t in found.trials) and found.best
    assert abs(found.after_bytes - found.baseline_bytes) < 1 * MiB  # allocator back to baseline


def test_repeat_agreement_compares_the_best_steps_of_repeats():
    from types import SimpleNamespace as R

    from tunekit.lab.runlog import repeat_agreement

    quiet = [[R(step_s_min=0.100), R(step_s_min=0.110)], [R(step_s_min=0.050), R(step_s_min=0.050)]]
    worst, verdict = repeat_agreement(quiet)
    assert worst == 0.110 / 0.100 and "up to 10%" in verdict and "stable" in verdict  # 1.1 <= 1.2
    worst, verdict = repeat_agreement([[R(step_s_min=0.1), R(step_s_min=0.13)]])
    assert round(worst, 6) == 1.3 and "busy" in verdict


def test_one_setting_at_the_labs_edge(lab, make_lab):
    """lab.setting_of: the one Setting every entry point makes from setting= or the toggle keywords."""
    from tunekit.core.setting import Setting

    s = lab.setting_of(precision="bf16")
    assert isinstance(s, Setting)
    assert (s.precision, s.micro_batch, s.seq_len, s.weights, s.parallel, s.world_size) == \
        ("bf16", 4, 64, None, None, 1)
    assert s.autocast == "bf16"   # fp32 weights under bf16 autocast
    assert lab.setting_of(setting=Setting(micro_batch=2)).seq_len == 64   # None in a Setting keeps the Lab's
    with pytest.raises(ToggleError) as e:   # words no Setting can hold: every problem, as lab.run says them
        lab.setting_of(micro_batch=0, lr=0)
    assert [p.split(",")[0] for p in e.value.problems] == ["micro_batch must be a whole number >= 1",
                                                          "lr must be a finite number > 0"]
    with pytest.raises(TypeError, match="unknown toggle"):
        lab.setting_of(micro_bach=2)
    with pytest.raises(ToggleError, match="in a Lab .those it can build., got 'adam'"):
        lab.setting_of(optimizer="adam")   # refused by name, as lab.run refused it (a Setting would say adamw)
    half = make_lab(model=torch.nn.Linear(4, 4).to(torch.bfloat16), batch_fn=lambda b, t: (torch.zeros(b, 4).bfloat16(),
                    torch.zeros(b, 4).bfloat16()), loss_fn=lambda m, x, y: (m(x) - y).float().pow(2).mean(), seq_len=1)
    assert half.setting_of().weights == "bf16"   # the live weights' dtype: what lab.plan plans


def test_checking_a_new_log_is_writable_leaves_no_empty_log(tmp_path):
    # `tunekit run` checks its --log before training; a run refused or failed after that check left
    # an empty tunekit-runs.jsonl in the current folder (one was committed to the repository)
    from tunekit.lab.runlog import check_writable

    log = tmp_path / "new" / "runs.jsonl"
    check_writable(log)
    assert log.parent.is_dir() and not log.exists()
    log.write_text('{"run_id": 0}\n')
    check_writable(log)
    assert log.read_text() == '{"run_id": 0}\n'      # an existing log is left as it was
