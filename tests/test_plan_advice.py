"""What a plan advises when a step does not fit (planning/advice.py): combinations of changes over
fake steps, supersets of one that fits pruned, those that fit ranked by expected tokens/s per GPU,
each with its caveats as Notes of declared kinds. No timing is compared."""
import pytest

import tunekit
from tunekit.core.expected import Expected
from tunekit.core.notes import kind_of, of_kind
from tunekit.core.setting import Setting
from tunekit.planning.advice import caveats, search_changes


def _search():
    """A search over made-up steps: 150 bytes at first on a 100-byte card; checkpointing saves 60,
    bf16 weights 40, SGD 10, each halving of the micro-batch 20; FSDP over N holds total/N + 5."""
    setting = Setting(precision="bf16", micro_batch=4, seq_len=8, optimizer="adamw")
    faked, counted = [], []

    def bytes_of(s):
        return 150 - 60 * s.checkpointing - 40 * (s.weights == "bf16") - 10 * (s.optimizer == "sgd") \
            - 20 * {4: 0, 2: 1, 1: 2}[s.micro_batch]

    def fake(s):
        faked.append(s)
        return {}

    def count(s, step):
        counted.append(s)
        step.update(ops=[], executed=s.micro_batch * (15.0 if s.checkpointing else 10.0))

    def place(step, s):
        return {"total": bytes_of(s) / s.world_size + 5 if s.parallel else bytes_of(s)}

    def expect(step, s, placed):   # 1,000 tokens/s over a 1 s micro-step, 0.2 s of it the update
        return Expected(step_s=1.0, tokens_per_s=1000.0, mfu=0.5,
                        rows=[("mm", "matmul", 1, 0.8, "compute", ""), ("optimizer step", "optimizer", 1, 0.2,
                                                                         "memory", "")])

    base = {"executed": 40.0, "ops": []}
    tried, ranked, pruned = search_changes(setting, base, 100.0, fake=fake, count=count, place=place,
                                           expect=expect, sharding=True)
    return setting, faked, counted, tried, ranked, pruned


def test_combinations_are_searched_supersets_of_what_fits_pruned_and_placement_needs_no_fake_step():
    setting, faked, counted, tried, ranked, pruned = _search()
    # 2 (checkpointing) x 2 (weights) x 2 (optimizer) x 3 (micro-batch 4, 2, 1) = 24 combinations.
    # The plan over FSDP 2 fits (150 / 2 + 5 = 80): from then on no combination is placed on 2 or more.
    # Checkpointing alone fits (90): its 11 supersets are pruned; bf16+mb2 (90) and bf16+sgd (100) fit:
    # bf16+mb1, bf16+sgd+mb2 and bf16+sgd+mb1 are pruned. 14 pruned, 9 faked (the plan's own step is given).
    assert len(pruned) == 14 and len(faked) == 9 and "checkpointing=True, weights='bf16'" in pruned
    assert all("parallel" not in o.label for o in tried[4:])   # the FSDP placements are the plan's own step's
    assert [o.label for o in tried[:3]] == ["parallel='fsdp', world_size=2", "micro_batch=2, grad_accum=2",
                                            "optimizer='sgd'"]
    # only what fits is counted: 5 options, one of them the plan's own step (already counted)
    assert len(counted) == 4 and all(o.fits == (o.flops_per_token == o.flops_per_token) for o in tried[1:])
    # ranked by expected tokens/s per GPU over an optimizer step: accum x 1,000 tokens over
    # accum x 0.8 s + 0.2 s: 4,000 / 3.4 = 1,176.5 (mb 1 x 4), 2,000 / 1.8 = 1,111.1 (mb 2 x 2), then
    # 1,000 each: one GPU before two, fewer bytes first (90, 100)
    assert [o.label for o in ranked] == ["optimizer='sgd', micro_batch=1, grad_accum=4",
                                         "weights='bf16', micro_batch=2, grad_accum=2", "checkpointing=True",
                                         "weights='bf16', optimizer='sgd'", "parallel='fsdp', world_size=2"]
    assert ranked[0].tokens_per_s == pytest.approx(4000 / 3.4) and ranked[1].tokens_per_s == pytest.approx(2000 / 1.8)
    assert ranked[2].flops_per_token == 1.5 and ranked[2].setting == setting.replace(checkpointing=True)


def test_each_option_says_its_caveats_by_kind():
    *_, ranked = _search()[:5]
    kinds = {o.label: [kind_of(n) for n in o.notes] for o in ranked}
    assert kinds == {
        # 100 of 100 bytes: 0% free, under 5%
        "optimizer='sgd', micro_batch=1, grad_accum=4": ["advice.optimizer", "advice.accumulation", "advice.tight"],
        "weights='bf16', micro_batch=2, grad_accum=2": ["advice.numerics", "advice.accumulation"],   # 10% free
        "checkpointing=True": [],
        "weights='bf16', optimizer='sgd'": ["advice.numerics", "advice.optimizer", "advice.tight"],
        "parallel='fsdp', world_size=2": ["advice.gpus"]}
    s = Setting(precision="bf16", micro_batch=4, seq_len=8)
    tight = ranked[2].__class__(("checkpointing=True",), s.replace(checkpointing=True), 96.0, True)
    assert [kind_of(n) for n in caveats(s, tight, 100.0)] == ["advice.tight"]          # 4% free
    roomy = ranked[2].__class__(("checkpointing=True",), s.replace(checkpointing=True), 95.0, True)
    assert caveats(s, roomy, 100.0) == []                                              # 5% free: not flagged


def test_a_plan_that_does_not_fit_ranks_what_fits_by_its_own_expected_speed():
    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    # 48,000 x 128 tokens under bf16 autocast: the activations alone are past an H100 (80 GB)
    p = tunekit.plan(cfg, "H100 SXM", precision="bf16", micro_batch=48000, seq_len=128)
    # halving the micro-batch (twice the accumulation) fits, and so does checkpointing, which recomputes
    assert not p.fits and [o.label for o in p.advice] == ["micro_batch=24000, grad_accum=2", "checkpointing=True"]
    assert p.advice[0].tokens_per_s > p.advice[1].tokens_per_s and p.advice[1].flops_per_token > 1.0
    # 2 x 2 x 2 x 8 micro-batches (48,000 down to 375) = 64 combinations: 55 add to the halving, 3 to
    # checkpointing alone: one note says so
    assert len(of_kind(p.notes, "advice.pruned")) == 1
    best = p.advice[0]
    assert all(kind_of(n).startswith("advice.") for o in p.advice for n in o.notes)
    # the option is the plan of its setting: the same bytes, and the same expected micro-step
    s = best.setting
    again = tunekit.plan(cfg, "H100 SXM", setting=s)
    assert again.fits and again.total_bytes == best.total_bytes
    assert again.expected.step_s == best.expected.step_s
    update = sum(r[3] for r in again.expected.rows if r[1] == "optimizer")
    a, step = s.grad_accum, again.expected.step_s
    assert best.tokens_per_s == pytest.approx(a * again.tokens / (a * (step - update) + update))
    assert "advice     2 combination(s) that fit, by expected" in repr(p) and "1. " + best.label in repr(p)
    pytest.importorskip("ipywidgets")
    from tunekit.planning.panel import advice_lines

    shown = advice_lines(p)   # the dashboard's "Plan for" panel: the best three, each with its caveats
    assert len(shown) == 2 and shown[0].startswith(f"try 1: <code>{best.label}</code>")
