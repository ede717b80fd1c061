"""lab.autotune: the search, its pruning rules, its budget and the state it leaves.

Most tests inject the measurements (``FakeTrials``): tokens/s is a known product of one factor per
toggle, and the clock moves one second per trial, so the winner, the pruned candidates and where
the budget stops are exact.
"""
import math
from types import SimpleNamespace

import pytest
import torch

from tunekit.lab import Lab
from tunekit.lab.autotune import LabTrials, autotune
from tunekit.lab.toggles import Env, ToggleError

SEQ = 128
# tokens/s = 1000 x one factor per toggle; the fastest legal CPU configuration is
# fp32, sdpa, adamw_fused, micro-batch 32: 1000 * 1.1 * 1.25 = 1375 tokens/s
PRECISION = {"fp32": 1.0, "bf16": 0.4, "tf32": 1.0, "fp16": 0.1}
ATTENTION = {"sdpa": 1.0, "math": 0.9, "flash": 2.0}
OPTIMIZER = {"adamw": 1.0, "adamw_fused": 1.1}
BATCH = {1: 0.5, 2: 0.7, 4: 0.85, 8: 1.0, 16: 1.2, 32: 1.25, 64: 1.1}


def speed(t, batch=BATCH, ckpt=0.9):
    return (1000 * PRECISION[t.precision] * ATTENTION[t.attention] * OPTIMIZER[t.optimizer]
            * batch[t.micro_batch] * (ckpt if t.checkpointing else 1.0) * (1.5 if t.compile else 1.0))


class FakeTrials:
    """Measurements from ``speed``; each trial takes ``cost_s`` on a fake clock."""

    def __init__(self, speed=speed, fit=lambda t: 64, cost_s=1.0, interrupt_at=None):
        self.speed, self.fit, self.cost_s, self.interrupt_at = speed, fit, cost_s, interrupt_at
        self.now, self.measured, self.searched, self.steps = 0.0, [], [], []

    def clock(self):
        return self.now

    def measure(self, t, steps):
        if self.interrupt_at is not None and len(self.measured) == self.interrupt_at:
            raise KeyboardInterrupt
        self.now += self.cost_s
        self.measured.append(t)
        self.steps.append(steps)
        tokens = t.micro_batch * t.grad_accum * SEQ
        # three timed steps filling the trial's cost_s (no warm-up): the cost the search predicts
        return SimpleNamespace(tokens_per_step=tokens, step_s_min=tokens / self.speed(t), steps=3, warmup=0,
                               step_s=self.cost_s / 3,
                               peak_mem_bytes=1000.0 * t.micro_batch, run_id=len(self.measured) - 1)

    def max_batch(self, t, limit):
        self.searched.append(t)
        return min(limit, self.fit(t))


@pytest.fixture
def lab(tmp_path):
    return Lab(log_path=tmp_path / "runs.jsonl")  # cpu-tiny, micro_batch 8, sdpa, adamw, fp32


def rows(found, **where):
    df = found.evidence
    for k, v in where.items():
        df = df[df[k] == v]
    return df


def test_picks_the_known_fastest_and_prunes_what_cannot_run_here(lab):
    fake = FakeTrials()
    found = autotune(lab, budget_s=1000, trials=fake, space={"compile": [False]})
    t = found.toggles
    assert (t.precision, t.attention, t.optimizer, t.micro_batch, t.checkpointing) == \
        ("fp32", "sdpa", "adamw_fused", 32, False)
    assert found.status == "complete" and not found.partial and not found.within_noise
    assert found.run.tokens_per_step / found.run.step_s_min == pytest.approx(1375)  # 1000*1.1*1.25
    pruned = rows(found, status="pruned").set_index("label")["why"]
    assert "same run as fp32" in pruned["tf32"]                   # tf32 is fp32 off CUDA
    assert "fp16 training is refused on CPU" in pruned["fp16"]    # problems() says why
    assert "not installed" in pruned["flash"]                     # never tried without flash-attn
    assert all(m.precision in ("fp32", "bf16") and m.attention != "flash" for m in fake.measured)
    assert not any(m.compile for m in fake.measured)              # the space said no compile
    # every measured candidate is in the evidence with its repeats' runs
    assert rows(found, status="winner")["label"].tolist() == ["mb=32 adamw_fused"]
    assert sum(found.evidence["repeats"]) == len(fake.measured)


def test_says_within_noise_when_the_top_two_are_inside_the_band(lab):
    close = {**BATCH, 16: 1.23}  # 1.25 / 1.23 = 1.016: inside the 3% band
    found = autotune(lab, budget_s=1000, trials=FakeTrials(lambda t: speed(t, close)),
                     space={"compile": [False]})
    assert found.within_noise and found.band == 0.03
    assert {found.toggles.micro_batch, found.runner_up.micro_batch} == {16, 32}
    assert "within noise" in found.verdict and "as fast on this machine" in found.verdict


def test_a_challenger_inside_the_band_does_not_replace_the_incumbent(lab):
    slight = {"adamw": 1.0, "adamw_fused": 1.02}  # 2% faster: inside the 3% band
    fake = FakeTrials(lambda t: speed(t) / OPTIMIZER[t.optimizer] * slight[t.optimizer])
    found = autotune(lab, budget_s=1000, trials=fake, space={"compile": [False]}, repeats=3)
    assert found.toggles.optimizer == "adamw"
    fused = rows(found, stage="optimizer", label="adamw_fused").iloc[0]
    assert fused["status"] == "kept" and "within the noise band" in fused["why"]
    assert found.close_calls == ["optimizer: adamw_fused at 1.02x baseline"]  # 1020 / 1000
    assert "Close calls" in found.verdict
    # ahead but inside the band: settled with more repeats, up to 3 x repeats = 9, and still a tie
    assert fused["repeats"] == 9


def test_a_real_gain_hidden_by_noisy_first_repeats_is_settled_by_more_repeats(lab):
    # adamw_fused is truly 10% faster (1100 vs 1000 tokens/s), but its repeats 0, 1, 3, 4 met load.
    # After 3 repeats its two fastest are 1100 and 990: band 1100/990 - 1 = 11% > its 10% lead, a
    # tie. The final race's two more repeats alone (3, 4: slowed) would leave it a tie; settling
    # goes on to repeat 5 (clean): two fastest 1100, 1100 -> band 3%, and the gain counts
    seen = {"adamw": 0, "adamw_fused": 0}
    slowed = {"adamw": {1: 0.8}, "adamw_fused": {0: 0.8, 1: 0.9, 3: 0.9, 4: 0.9}}

    def noisy(t):
        base = speed(t)
        if t.micro_batch != 8 or t.attention != "sdpa" or t.precision != "fp32":
            return base
        i = seen[t.optimizer]
        seen[t.optimizer] += 1
        return base * slowed[t.optimizer].get(i, 1.0)

    found = autotune(lab, budget_s=1000, trials=FakeTrials(noisy), space={"compile": [False], "micro_batch": [8]},
                     repeats=3)
    assert found.toggles.optimizer == "adamw_fused"
    fused = rows(found, stage="optimizer", label="adamw_fused").iloc[0]
    assert fused["status"] == "winner" and fused["repeats"] > 3


def test_weak_candidates_get_fewer_repeats(lab):
    close = {**BATCH, 16: 1.23}
    found = autotune(lab, budget_s=1000, trials=FakeTrials(lambda t: speed(t, close)),
                     space={"compile": [False]}, repeats=3)
    ev = found.evidence.set_index("label")
    # nobody is judged on one trial; after the second, bf16 (0.4x) and micro-batches 1, 2, 4, 8, 64
    # (1.25 / 1.1 = 1.14 > 1.03) drop out; 16 and 32 (1.016 apart) race on to the full 3, and in
    # the final race (the winner and the two best others: 16 and 64) to 3 + 2; 64 drops again
    assert ev.loc["bf16", "repeats"] == 2 and ev.loc["mb=1 adamw_fused", "repeats"] == 2
    assert ev.loc["mb=16 adamw_fused", "repeats"] == 5 and ev.loc["mb=32 adamw_fused", "repeats"] == 5
    assert ev.loc["mb=64 adamw_fused", "repeats"] == 2
    assert ev.loc["mb=64 adamw_fused", "status"] == "dropped"


def test_trials_take_more_steps_once_the_step_time_is_known(lab):
    from tunekit.lab.autotune import timed_steps

    assert timed_steps(0.01, 3, 0.25) == 25 and timed_steps(0.5, 3, 0.25) == 3  # ceil(0.25/0.01)
    assert timed_steps(0.001, 3, 0.25) == 30 and timed_steps(float("nan"), 3, 0.25) == 3  # 10x cap
    fake = FakeTrials(cost_s=0.03)  # fake steps of 0.01 s: 25 steps fill 0.25 s
    autotune(lab, budget_s=1000, trials=fake, space={"compile": [False]})
    assert fake.steps[0] == 3 and fake.steps[1] == 3  # fp32 and bf16: nothing known yet
    assert fake.steps[2] == 25  # the start's second trial


def test_checkpointing_not_tried_when_memory_is_not_the_limit(lab):
    fake = FakeTrials(fit=lambda t: 64)  # the largest searched micro-batch (8 x 8) fits without it
    found = autotune(lab, budget_s=1000, trials=fake, space={"compile": [False]})
    assert not any(m.checkpointing for m in fake.measured)
    assert not any(s.checkpointing for s in fake.searched)  # not even its max-batch search ran
    why = rows(found, checkpointing=True)["why"].tolist()
    assert len(why) == 1 and why[0].startswith("memory is not the limit")


def test_checkpointing_tried_only_at_micro_batches_that_do_not_fit_without_it(lab):
    fake = FakeTrials(fit=lambda t: 32 if t.checkpointing else 8)
    found = autotune(lab, budget_s=1000, trials=fake, space={"compile": [False]})
    ckpt = sorted({m.micro_batch for m in fake.measured if m.checkpointing})
    assert ckpt == [16, 32]  # 8 fits without it; 64 does not fit even with it
    assert max(m.micro_batch for m in fake.measured if not m.checkpointing) == 8
    no_fit = rows(found, status="pruned", checkpointing=False)
    assert sorted(no_fit[no_fit["fits"] == False]["micro_batch"]) == [16, 32, 64]  # noqa: E712
    # ckpt at 32: 1000 * 1.1 * 1.25 * 0.9 = 1237.5 beats 8 without (1100) beyond noise
    assert (found.toggles.micro_batch, found.toggles.checkpointing) == (32, True)


def test_flash_not_tried_where_not_installed_even_on_cuda(lab, monkeypatch):
    monkeypatch.setattr(lab, "env", lambda: Env(device_type="cuda", flash_installed=False, block_size=128))
    fake = FakeTrials()
    found = autotune(lab, budget_s=1000, trials=fake, space={"compile": [False], "precision": ["fp32", "bf16"]})
    assert not any(m.attention == "flash" for m in fake.measured)
    assert "not installed" in rows(found, attention="flash")["why"].iloc[0]


def test_keep_global_batch_keeps_micro_batch_times_grad_accum(lab):
    fake = FakeTrials()
    found = autotune(lab, budget_s=1000, trials=fake, keep_global_batch=True, space={"compile": [False]})
    assert {m.micro_batch * m.grad_accum for m in fake.measured} == {8}
    assert {m.micro_batch for m in fake.measured} == {1, 2, 4, 8}  # the divisors of 8
    assert found.toggles.micro_batch * found.toggles.grad_accum == 8


def test_a_tiny_budget_stops_early_with_a_partial_result_that_says_so(lab):
    fake = FakeTrials(cost_s=1.0)
    found = autotune(lab, budget_s=2.5, trials=fake)
    # trial 1 (start) at 0 s, trial 2 (bf16, no cost known yet) at 1 s; at 2 s the start's second
    # repeat would cost 1 s (as its first did) and end at 3 s > 2.5 s: not started
    assert len(fake.measured) == 2 and found.status == "budget" and found.partial
    assert found.elapsed_s == 2.0 and "STOPPED EARLY" in found.verdict
    undone = "stages not finished: precision, attention, optimizer, micro_batch, final, compile"
    assert undone in found.notes
    assert found.toggles.precision == "fp32"  # what it had: the start, measured


def test_compile_is_tried_last_only_with_enough_budget_left(lab):
    fake = FakeTrials()
    found = autotune(lab, budget_s=1000, trials=fake, compile_s=10, keep="start")  # no real compile
    assert fake.measured[-1].compile and sum(m.compile for m in fake.measured) >= 1
    assert all(not m.compile for m in fake.measured[:-3])
    assert found.toggles.compile  # 1.5x beyond noise
    fake = FakeTrials()
    found = autotune(lab, budget_s=30, trials=fake, compile_s=500)
    assert not any(m.compile for m in fake.measured)
    assert "compile_s=500" in rows(found, compile=True)["why"].iloc[0]


@pytest.mark.parametrize("kwargs,words", [
    (dict(budget_s=0), "budget_s"), (dict(budget_s=-1), "budget_s"),
    (dict(budget_s=math.nan), "budget_s"), (dict(budget_s=True), "budget_s"),
    (dict(objective="loss"), "objective"), (dict(space={"lr": [1e-3]}), "space"),
    (dict(space={"precision": ["fp64"]}), "space"), (dict(space={"micro_batch": [0]}), "space"),
    (dict(keep="best"), "keep"), (dict(memory_budget_bytes=-5), "memory_budget_bytes"),
    (dict(progress="bar"), "progress"), (dict(trial_s=-1), "trial_s"), (dict(repeats=0), "repeats"),
    (dict(max_micro_batch=0), "max_micro_batch"),
])
def test_bad_input_refused_before_any_work(lab, kwargs, words):
    fake = FakeTrials()
    with pytest.raises(ToggleError, match=words):
        lab.autotune(**{"budget_s": 10, **kwargs}, trials=fake)
    assert fake.measured == [] and fake.searched == [] and len(lab.results()) == 0


def test_ctrl_c_raises_and_keeps_what_was_measured(lab):
    fake = FakeTrials(interrupt_at=2)
    with pytest.raises(KeyboardInterrupt):
        lab.autotune(budget_s=1000, trials=fake)
    kept = lab.last_autotune
    assert kept.status == "interrupted" and "INTERRUPTED" in kept.verdict
    assert sum(kept.evidence["repeats"]) == 2 and kept.toggles.precision == "fp32"


def test_real_search_leaves_weights_as_before_and_applies_the_winner(tmp_path):
    # micro-batch 2 vs 4 only, one timed step each: a real search of a few seconds
    lab = Lab(log_path=tmp_path / "runs.jsonl", micro_batch=2, seq_len=32)
    lab.run(steps=1, warmup=0)
    before = [p.detach().clone() for p in lab.model.parameters()]
    state_before = {k: v.clone() for k, v in lab.optimizer.state[next(lab.model.parameters())].items()}
    n_runs = len(lab.results())
    space = {"precision": ["fp32"], "attention": ["sdpa"], "optimizer": ["adamw"], "compile": [False],
             "micro_batch": [2, 4]}
    # real trials on a clock that never moves: the search ends when the space is exhausted, never
    # on the budget, however slow a busy machine makes the trials
    trials = LabTrials(lab, warmup=0)
    trials.clock = lambda: 0.0
    found = lab.autotune(budget_s=60, space=space, max_micro_batch=4, steps=1, warmup=0, repeats=1, trial_s=0,
                         trials=trials)
    assert found.status == "complete" and found.state.startswith("winner applied")
    assert all(torch.equal(a, b) for a, b in zip(before, lab.model.parameters()))
    state_after = lab.optimizer.state[next(lab.model.parameters())]
    assert all(torch.equal(v, state_after[k]) for k, v in state_before.items())
    assert lab.resolve() == found.toggles  # the next lab.run() uses the winner
    ids = {i for ids in found.evidence["run_ids"] for i in ids}
    assert ids and ids <= set(lab.results()["run_id"][n_runs:])  # every trial is a logged run
    assert found.figure.data[0].type == "bar"


def test_keep_start_restores_the_starting_toggles(lab):
    start = lab.resolve()
    fake = FakeTrials()
    found = autotune(lab, budget_s=1000, trials=fake, keep="start", space={"compile": [False]})
    assert found.toggles.micro_batch == 32 and found.state.startswith("start restored")
    assert lab.resolve() == start and lab.adapter.attention == "sdpa" and lab._opt_name == "adamw"


def test_dashboard_button_runs_autotune_and_shows_the_evidence(lab):
    dash = lab.dashboard()
    dash.autotune_budget.value = 100
    dash.autotune_kwargs = {"trials": FakeTrials(), "space": {"compile": [False]}}
    dash.autotune_button.click()
    assert dash.last_autotune.toggles.micro_batch == 32
    assert dash.controls["micro_batch"].value == 32 and dash.controls["optimizer"].value == "adamw_fused"
    assert "tokens/s" in dash.autotune_out.value and "1,375" in dash.autotune_out.value  # 1000*1.1*1.25
    assert "spread (%)" in dash.autotune_out.value and "peak (MiB)" in dash.autotune_out.value
    assert dash.progress.description == "done" and "autotune" in dash.figures
    dash.autotune_budget.value = 0
    dash.autotune_button.click()
    assert "budget_s must be" in dash.message.value
