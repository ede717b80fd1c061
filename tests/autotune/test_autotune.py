"""lab.autotune: the search, its pruning rules, its budget and the state it leaves.

Most tests inject the measurements (``FakeTrials``): tokens/s is a known product of one factor per
toggle, and the clock moves one second per trial, so the winner, the pruned candidates and where
the budget stops are exact.
"""
import math
from types import SimpleNamespace

import pytest
import torch

from tunekit.autotune import LabTrials, autotune
from tunekit.core.conditions import Conditions
from tunekit.core.setting import Setting
from tunekit.core.toggles import Env, ToggleError

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


QUIET = Conditions("quiet", "nothing else used the machine")
BUSY = Conditions("busy", "tasks waited for a CPU 97% of the time")


class FakeTrials:
    """Measurements from ``speed``; each trial takes ``cost_s`` on a fake clock. ``busy(t, n)``:
    trial n (of all) of ``t`` runs on a busy machine, measured at half speed."""

    def __init__(self, speed=speed, fit=lambda t: 64, cost_s=1.0, interrupt_at=None, busy=lambda t, n: False):
        self.speed, self.fit, self.cost_s, self.interrupt_at = speed, fit, cost_s, interrupt_at
        self.busy = busy
        self.now, self.measured, self.searched, self.steps = 0.0, [], [], []

    def clock(self):
        return self.now

    def measure(self, t, steps):
        if self.interrupt_at is not None and len(self.measured) == self.interrupt_at:
            raise KeyboardInterrupt
        busy = self.busy(t, len(self.measured))
        self.now += self.cost_s
        self.measured.append(t)
        self.steps.append(steps)
        tokens = t.micro_batch * t.grad_accum * SEQ
        # three timed steps filling the trial's cost_s (no warm-up): the cost the search predicts
        return SimpleNamespace(tokens_per_step=tokens, step_s_min=tokens / self.speed(t) * (2 if busy else 1),
                               steps=3, warmup=0, step_s=self.cost_s / 3, conditions=BUSY if busy else QUIET,
                               peak_mem_bytes=1000.0 * t.micro_batch, run_id=len(self.measured) - 1)

    def max_batch(self, t, limit):
        self.searched.append(t)
        return min(limit, self.fit(t))


@pytest.fixture
def lab(make_lab):
    return make_lab()  # cpu-tiny, micro_batch 8, sdpa, adamw, fp32


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


# only the micro-batch stage searches: 8 (the start), 16 and 32
ONLY_BATCH = {"compile": [False], "precision": ["fp32"], "attention": ["sdpa"], "optimizer": ["adamw"],
              "micro_batch": [8, 16, 32]}
TRUE = {8: 1000, 16: 1130, 32: 1160}  # the case: challengers 1.13x and 1.16x the incumbent


def noisy_after_first(clean_from=math.inf):
    """tokens/s: each candidate's first repeat and those from repeat ``clean_from`` on at its true
    speed, the others slowed 25% by noise the conditions meter did not see."""
    seen = {}

    def tokens_per_s(t):
        i = seen[t.micro_batch] = seen.get(t.micro_batch, -1) + 1
        return TRUE[t.micro_batch] / (1 if i == 0 or i >= clean_from else 1.25)
    return tokens_per_s


def test_top_candidates_the_band_cannot_separate_are_inconclusive(lab):
    # each candidate's two fastest repeats disagree by 25% (1000 vs 800): the band ±25% is wider than the
    # challengers' 16% and 13% leads, so nothing beats the incumbent, and more repeats do not help
    fake = FakeTrials(noisy_after_first())
    found = autotune(lab, budget_s=1000, trials=fake, repeats=3, space=ONLY_BATCH)
    assert found.toggles.micro_batch == 8 and found.status == "complete"  # the incumbent is kept ...
    assert found.inconclusive and [t.micro_batch for t in found.tied] == [32, 16]  # ... but not proven best
    assert found.band == pytest.approx(0.25)  # 1000 / 800 - 1
    ev = found.evidence.set_index("micro_batch")
    # stage race 3 repeats each; settling 8 vs 32 to 3 x 3 = 9; final race (repeats 5) brings 16 to 5 and
    # settles 8 vs 32 to 3 x 5 = 15; the tiebreak adds TIEBREAK_ROUNDS x repeats = 2 x 3 = 6 to all three
    assert (ev.loc[8, "repeats"], ev.loc[16, "repeats"], ev.loc[32, "repeats"]) == (21, 11, 21)
    assert list(ev.loc[[16, 32], "status"]) == ["tied", "tied"]
    assert "the noise band ±25% cannot tell them apart" in ev.loc[32, "why"]
    v = found.verdict
    assert v.startswith("INCONCLUSIVE: the measurements cannot tell baseline (1,000 tokens/s) from "
                        "mb=32 (1.16x); mb=16 (1.13x) (noise band ±25%)")
    assert "not because it was shown fastest" in v and "as fast on this machine" not in v
    assert "Machine: quiet in all 53 trials" in v  # 21 + 11 + 21
    assert found.close_calls == []  # a 13-16% gap is no close call: it was not resolved
    # the chart: no lone green winner below taller bars; all three tied, one colour, marked
    bar = found.figure.data[0]
    assert list(bar.marker.color) == ["#ff7f0e"] * 3
    assert [a.text for a in found.figure.layout.annotations] == ["tied (kept)", "tied", "tied"]
    assert found.figure.layout.title.text.startswith("autotune: INCONCLUSIVE: 3 candidates tied")


def test_the_tiebreak_decides_when_more_repeats_separate_the_top(lab):
    # the noise stops at each candidate's 16th repeat (index 15): the tiebreak's first round gives 8 and
    # 32 a clean second repeat, band back to the 3% floor: 1160 > 1000 x 1.03, so 32 wins
    found = autotune(lab, budget_s=1000, trials=FakeTrials(noisy_after_first(clean_from=15)), repeats=3,
                     space=ONLY_BATCH)
    assert found.toggles.micro_batch == 32 and not found.inconclusive and found.tied == []
    ev = found.evidence.set_index("micro_batch")
    assert ev.loc[8, "status"] == "dropped" and ev.loc[8, "why"].startswith("tiebreak: beaten beyond noise")
    assert (ev.loc[8, "repeats"], ev.loc[16, "repeats"], ev.loc[32, "repeats"]) == (16, 6, 16)  # one round
    # 16 stays within the 3% noise floor of 32 (1160 / 1130 = 1.027): a tie, not a doubt
    assert found.within_noise and found.runner_up.micro_batch == 16
    assert list(found.figure.data[0].marker.color).count("#2ca02c") == 1


def test_the_tiebreak_ends_with_the_budget_and_the_result_stays_complete(lab):
    # 35 trials before the tiebreak (15 + 5 + 15, as above), 1 s each; one round (3 trials) ends at 38 s, and
    # the next trial (micro-batch 8, predicted from the cheapest per-sample cost seen: 1 s x 8 / 32 = 0.25 s)
    # would end at 38.25 s > 38.2 s
    fake = FakeTrials(noisy_after_first())
    found = autotune(lab, budget_s=38.2, trials=fake, repeats=3, space=ONLY_BATCH)
    assert len(fake.measured) == 38 and found.status == "complete" and found.inconclusive
    assert "the tiebreak between the top candidates ran until the budget was spent" in found.notes


def test_busy_trials_are_measured_again_and_never_judged(lab):
    # the first three trials run on a busy machine (at half speed): the start's first repeat is
    # measured three times (two retries), then the search goes on as on a quiet machine
    fake = FakeTrials(busy=lambda t, n: n < 3)
    found = autotune(lab, budget_s=1000, trials=fake, space={"compile": [False]})
    t = found.toggles
    assert (t.optimizer, t.micro_batch) == ("adamw_fused", 32) and not found.inconclusive and found.busy == []
    base = rows(found, label="baseline").iloc[0]
    assert base["busy_trials"] == 3 and fake.measured[:3] == [found.start] * 3
    assert base["tokens_per_s"] == pytest.approx(1000)  # its quiet repeats; the busy ones measured 500
    assert f"Machine: busy in 3 of {len(fake.measured)} trials" in found.verdict


def test_a_candidate_never_measured_quiet_is_not_judged_and_says_so(lab):
    # every trial of the fused optimizer is busy (measured at half speed: 550 tokens/s, below the
    # 1000 of the loop it would beat by 10% on a quiet machine): it is never dropped, and the tiebreak
    # cannot measure it quiet either
    fake = FakeTrials(busy=lambda t, n: t.optimizer == "adamw_fused")
    found = autotune(lab, budget_s=1000, trials=fake, space={"compile": [False]}, repeats=3)
    assert found.toggles.optimizer == "adamw" and found.busy == ["adamw_fused"]
    assert found.inconclusive and [t.optimizer for t in found.tied] == ["adamw_fused"]
    fused = rows(found, label="adamw_fused").iloc[0]
    # 3 repeats in its stage + 2 x 3 in the tiebreak = 9 repeats, each measured 1 + BUSY_RETRIES = 3 times
    assert fused["repeats"] == fused["busy_trials"] == 27 and fused["status"] == "tied"
    assert "measured on a busy machine in every trial, so not judged" in fused["why"]
    assert "Never measured on a quiet machine, so not judged: adamw_fused" in found.verdict
    assert "(noise band ±3%, measured busy)" in found.verdict
    assert found.figure.data[0].marker.pattern.shape[list(found.evidence.label[found.evidence.repeats > 0])
                                                     .index("adamw_fused")] == "/"
    dash = lab.dashboard()
    dash.autotune_kwargs = {"trials": FakeTrials(busy=fake.busy), "space": {"compile": [False]}}
    dash.autotune_button.click()
    assert "#e65100" in dash.message.value and "INCONCLUSIVE" in dash.message.value  # orange, not green


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
    from tunekit.autotune import timed_steps

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


def test_the_signature_is_the_options_dataclass():
    import dataclasses
    import inspect

    from tunekit.autotune import AutotuneOptions

    params = list(inspect.signature(autotune).parameters.values())[1:]  # after the lab
    assert params[-1].name == "setting" and params[-1].default is None   # where it starts (None: the Lab's)
    assert [(p.name, p.default) for p in params[:-1]] == \
        [(f.name, f.default) for f in dataclasses.fields(AutotuneOptions)]
    options, problems = AutotuneOptions().checked()
    assert problems == [] and options == AutotuneOptions()  # the defaults pass their own checks


def test_every_bad_option_is_named_at_once(lab):
    with pytest.raises(ToggleError) as e:
        lab.autotune(budget_s=0, repeats=0, noise=1.0, memory_budget_bytes=True, trials=FakeTrials())
    assert [p.split(" must")[0] for p in e.value.problems] == ["budget_s", "repeats", "noise", "memory_budget_bytes"]
    assert e.value.problems[3] == "memory_budget_bytes must be a finite number of bytes > 0, or None, got True"


def test_the_stages_are_the_declared_ones(lab, monkeypatch):
    # a stage the search has no rule for tries each declared value of its toggles from the incumbent
    from tunekit.core import toggles as tg
    monkeypatch.setattr(tg, "SEARCH", (("kernels", ("attention", "optimizer")),))
    fake = FakeTrials()
    found = autotune(lab, budget_s=1000, trials=fake, space={"optimizer": ["adamw", "adamw_fused"]})
    assert set(found.evidence["stage"]) == {"start", "kernels"} and found.toggles.optimizer == "adamw_fused"
    assert {(m.attention, m.optimizer) for m in fake.measured} == \
        {("sdpa", "adamw"), ("math", "adamw"), ("sdpa", "adamw_fused")}  # one toggle at a time
    assert "only on CUDA" in rows(found, label="flash")["why"].iloc[0]  # the Lab's check, no rule of its own
    with pytest.raises(ToggleError, match="'precision' is not searched"):
        autotune(lab, budget_s=10, trials=FakeTrials(), space={"precision": ["fp32"]})


def test_ctrl_c_raises_and_keeps_what_was_measured(lab):
    fake = FakeTrials(interrupt_at=2)
    with pytest.raises(KeyboardInterrupt):
        lab.autotune(budget_s=1000, trials=fake)
    kept = lab.last_autotune
    assert kept.status == "interrupted" and "INTERRUPTED" in kept.verdict
    assert sum(kept.evidence["repeats"]) == 2 and kept.toggles.precision == "fp32"


def test_real_search_leaves_weights_as_before_and_applies_the_winner(make_lab, capsys):
    # micro-batch 2 vs 4 only, one timed step each: a real search of a few seconds
    lab = make_lab(micro_batch=2, seq_len=32)
    lab.run(steps=1, warmup=0)
    capsys.readouterr()
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
    # one display for the whole search: its line; the lab.run and max-batch calls inside are quiet
    from tunekit.core.run_text import autotune_line
    assert capsys.readouterr().err == autotune_line(found) + "\n"
    ids = {i for ids in found.evidence["run_ids"] for i in ids}
    assert ids and ids <= set(lab.results()["run_id"][n_runs:])  # every trial is a logged run
    assert found.figure.data[0].type == "bar"


def test_keep_start_restores_the_starting_toggles(lab):
    start = lab.resolve()
    fake = FakeTrials()
    found = autotune(lab, budget_s=1000, trials=fake, keep="start", space={"compile": [False]})
    assert found.toggles.micro_batch == 32 and found.state.startswith("start restored")
    assert lab.resolve() == start and lab.adapter.attention == "sdpa" and lab.optimizer_name == "adamw"


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


def test_a_max_batch_search_that_did_not_finish_says_so_in_the_notes(lab):
    # the Lab's trials keep the last search; one stopped at its limit or budget is quoted
    class Unfinished(FakeTrials):
        def max_batch(self, t, limit):
            self.last_search = SimpleNamespace(stopped="budget", verdict="stopped by the time budget (budget_s=5)")
            return super().max_batch(t, limit)

    found = autotune(lab, budget_s=1000, trials=Unfinished(), space={"compile": [False]})
    note = next(n for n in found.notes if n.startswith("largest micro-batch that fits"))
    assert note.endswith("); stopped by the time budget (budget_s=5)")   # after "(searched up to N)"
    plain = autotune(lab, budget_s=1000, trials=FakeTrials(), space={"compile": [False]})
    assert next(n for n in plain.notes if n.startswith("largest micro-batch")).endswith(")")


class _Tty:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def isatty(self):
        return True


def test_lab_autotune_shows_stage_trial_and_best_then_one_line(lab, monkeypatch):
    from tunekit.view import progress

    fake, calls = FakeTrials(), []
    monkeypatch.setattr(progress, "clock", fake.clock)
    monkeypatch.setattr(progress.sys, "stderr", _Tty())
    found = lab.autotune(budget_s=1000, trials=fake, space={"compile": [False]},
                         progress=lambda *a: calls.append(a))
    text = progress.sys.stderr.text
    # the second trial: the start measured once at 1000 x 1 = 1,000 tokens/s, 1 fake second spent
    assert ("\rautotune: stage 1/6 precision · trial 2: bf16 (repeat 1) · best 1,000 tokens/s · 1.0 s / "
            "budget 1000 s [....................]\x1b[K") in text
    assert "\rautotune: stage 2/6 attention · trial 5: math (repeat 1) · best 1,000 tokens/s" in text
    # the winner at 1000 x 1.1 x 1.25 = 1,375 tokens/s, 1.375x the start; one trial per fake second
    line = ("autotune: winner mb=32 adamw_fused at 1,375 tokens/s · 1.38x the start · 14 candidates, "
            f"10 measured · {len(fake.measured)}.0 s of 1000 s · complete")
    assert text.endswith("\r" + line + "\x1b[K\n") and text.count("\n") == 1
    assert len(calls) == len(fake.measured) and calls[1][2].startswith("stage 1/6 precision · trial 2: bf16")
    monkeypatch.setattr(progress.sys, "stderr", _Tty())
    assert lab.autotune(budget_s=1000, trials=FakeTrials(), space={"compile": [False]}, verbose=False).toggles \
        == found.toggles and progress.sys.stderr.text == ""


def test_the_search_starts_from_the_toggles_or_setting_it_is_given(lab):
    """lab.autotune takes the start as lab.run does: toggle keywords or setting=, one Setting at its edge."""
    found = lab.autotune(budget_s=10, trials=FakeTrials(), verbose=False, micro_batch=4, checkpointing=True)
    assert (found.start.micro_batch, found.start.checkpointing) == (4, True)   # the Lab's own start: 8, False
    found = lab.autotune(budget_s=10, trials=FakeTrials(), verbose=False,
                         setting=Setting(micro_batch=2))   # seq_len None: the Lab's
    assert found.start.micro_batch == 2
    with pytest.raises(ValueError, match="either setting= or the step keywords"):
        lab.autotune(budget_s=10, trials=FakeTrials(), setting=Setting(), micro_batch=2)
    with pytest.raises(ToggleError, match="autotune searches one process|this searches one process"):
        lab.autotune(budget_s=10, trials=FakeTrials(), setting=Setting(parallel="ddp", world_size=2))
    with pytest.raises(ToggleError, match="micro_batch must be a whole number >= 1, got 0"):
        lab.autotune(budget_s=10, trials=FakeTrials(), micro_batch=0)   # refused before any trial
