"""What to change when a planned step does not fit: COMBINATIONS of changes (checkpointing, half
weights, SGD for AdamW, the micro-batch halved with the accumulation doubled to keep the global
batch, FSDP over 2/4/8 GPUs), each tried over the plan's fake steps, and those that fit ranked by
their EXPECTED tokens/s per GPU, each with its caveats (`core.notes.Note`, kinds ``advice.*``).

Reuse: the planner caches a model per weight dtype; a change that only moves the placement (FSDP
over N) places a step already faked (no fake step more). A combination that fits WITH ROOM (at
least `TIGHT` of the card free) prunes what could only cost more: the combinations adding changes
to it (each costs speed, numerics or convergence) and more GPUs for it (more to rent). A TIGHT fit
prunes nothing: its neighbours (more GPUs, checkpointing, ...) are tried, since the allocator's
fragmentation may not leave it its last few percent. What was not tried is listed (`Skipped`: which
combination, on how many GPUs, why, and the fit that made it pointless). A step is counted op by op
(for its expected speed and its FLOPs per token) only when it fits somewhere: an option that does
not fit has no FLOPs per token (NaN).

The search itself is pure: the planner hands it callables that fake, count, place and expect.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from tunekit.core.fmt import fmt_pct
from tunekit.core.notes import Note
from tunekit.core.setting import HALF
from tunekit.core.units import is_missing

NaN = math.nan
GPUS = (2, 4, 8)     # FSDP over these many GPUs of the planned kind (one node)
TIGHT = 0.05         # a setting that leaves less than this share of the card free is flagged


@dataclass
class Option:
    """One combination of changes tried: its setting, rank 0's total bytes, whether it fits, its
    executed FLOPs per token against the plan's, and (when it fits) the expected speed.

    ``tokens_per_s``: expected, per GPU, over a whole optimizer step (``grad_accum`` micro-steps,
    one update); NaN where no expectation (a device figure missing) or not counted."""

    changes: tuple                 # keyword changes, as ``plan`` takes them ("checkpointing=True", ...)
    setting: object                # the tunekit.Setting tried
    total_bytes: float
    fits: bool
    flops_per_token: float = NaN   # executed FLOPs per token / the plan's (NaN: not counted)
    tokens_per_s: float = NaN
    expected: object = None        # core.expected.Expected of one micro-step (None: not expected)
    notes: list = field(default_factory=list)   # the caveats: Notes of kinds advice.*

    @property
    def label(self) -> str:
        return ", ".join(self.changes)

    @property
    def gpus(self) -> int:
        return self.setting.world_size or 1

    def as_alternative(self) -> tuple:
        """`Plan.alternatives`' row: (change, total bytes, fits, FLOPs per token vs the plan's)."""
        return self.label, self.total_bytes, self.fits, self.flops_per_token


def dimensions(setting) -> list:
    """Each change's levels: [(labels, Setting changes)], level 0 the plan's own."""
    dims = []
    if not setting.checkpointing:
        dims.append([((), {}), (("checkpointing=True",), dict(checkpointing=True))])
    if setting.weights in (None, "fp32") and setting.precision in HALF:
        dims.append([((), {}), ((f"weights={setting.precision!r}",), dict(weights=setting.precision))])
    if setting.optimizer in ("adamw", "adamw_fused"):
        dims.append([((), {}), (("optimizer='sgd'",), dict(optimizer="sgd"))])
    levels, mb, accum = [((), {})], setting.micro_batch, setting.grad_accum or 1
    while mb % 2 == 0:   # the same global batch: micro_batch halved, grad_accum doubled
        mb, accum = mb // 2, accum * 2
        levels.append(((f"micro_batch={mb}, grad_accum={accum}",), dict(micro_batch=mb, grad_accum=accum)))
    if len(levels) > 1:
        dims.append(levels)
    return dims


@dataclass(frozen=True)
class Skipped:
    """A combination of changes not tried, on ``gpus`` (1: one GPU, N: FSDP over N), and why:
    ``why`` one of `SKIPPED` (a code), ``by`` the label of what made it pointless."""

    changes: str
    gpus: tuple
    why: str
    by: str = ""

    def __str__(self) -> str:
        many = ", ".join(str(g) for g in self.gpus if g > 1)
        on = " or ".join(x for x in ("one GPU" if 1 in self.gpus else "", f"FSDP over {many}" if many else "") if x)
        return f"{self.changes or 'the plan'} on {on}: {SKIPPED[self.why].format(by=self.by)}"


SKIPPED = {"adds_to_fit": "adds changes to {by}, which fits with room (each costs speed, numerics or convergence)",
           "more_gpus": "{by} already fits with room on as many GPUs or fewer (more GPUs: more to rent)",
           "not_faked": "a fake step cannot take it ({by})"}


def roomy(total: float, memory: float) -> bool:
    """Fits with at least `TIGHT` of the card free (what prunes other combinations)."""
    return memory - total >= TIGHT * memory


def search_changes(setting, base_step, memory: float, *, fake, count, place, expect, sharding: bool):
    """(every Option tried, the Options that fit best first, the `Skipped`).

    ``fake(s) -> step``, not counted (raises ValueError for a step it cannot fake); ``count(s, step)``:
    the step counted op by op; ``place(step, s) -> Placed`` (``.total``, ...) with ``s.parallel`` the
    layout; ``expect(step, s, placed) -> Expected | None``. ``sharding``: also FSDP over `GPUS`.

    The ranking: expected tokens/s per GPU, fastest first; at equal speed a fit with room before a
    tight one, then fewer GPUs, then fewer bytes. So the first pick is tight only when it is faster
    than every fit with room; one with room that is as fast or faster comes first. Options without
    an expectation come last."""
    dims = dimensions(setting)
    gpus = (1,) + (GPUS if sharding else ())
    base = (0,) * len(dims)
    combos = [base] + sorted((c for c in itertools.product(*(range(len(d)) for d in dims)) if c != base),
                             key=lambda c: (sum(c), c))
    roomy_fits, tried, skipped, names = [], [], [], {}
    per_token = base_step.executed / setting.micro_batch
    for combo in combos:
        labels = sum((dims[i][lv][0] for i, lv in enumerate(combo)), ())
        label = names[combo] = ", ".join(labels)
        change = {k: v for i, lv in enumerate(combo) for k, v in dims[i][lv][1].items()}
        # the fewest GPUs at which a subset of these changes already fits with room: more is not tried
        cap, by = min(((g, c) for c, g in roomy_fits if c != combo and all(a <= b for a, b in zip(c, combo))),
                      default=(len(gpus), None))
        if cap == 0:
            skipped.append(Skipped(label, gpus, "adds_to_fit", names[by]))
            continue
        s = setting.replace(**change)
        try:
            step = base_step if combo == base else fake(s)
        except ValueError as e:   # a change that cannot be faked is not offered
            skipped.append(Skipped(label, gpus[:cap], "not_faked", str(e)))
            continue
        own = None   # the fewest GPUs at which this combination fits with room
        for g in range(cap):
            if combo == base and g == 0:
                continue   # the plan itself
            sg, extra = (s, ()) if g == 0 else \
                (s.replace(parallel="fsdp", world_size=gpus[g]), (f"parallel='fsdp', world_size={gpus[g]}",))
            placed = place(step, sg)
            fits = placed.total <= memory
            opt = Option(labels + extra, sg, placed.total, fits)
            if fits and not step.has("ops"):
                count(s, step)
            if step.executed is not None:
                opt.flops_per_token = step.executed / s.micro_batch / per_token
            if fits:
                _expected(opt, expect(step, sg, placed))
                opt.notes = caveats(setting, opt, memory)
            tried.append(opt)
            if fits and roomy(opt.total_bytes, memory):
                roomy_fits.append((combo, g))
                own = opt.label
                break
        if own is not None and g + 1 < len(gpus):
            skipped.append(Skipped(label, gpus[g + 1:], "more_gpus", own))
        elif own is None and cap < len(gpus):
            skipped.append(Skipped(label, gpus[cap:], "more_gpus", _on(names[by], gpus[cap])))
    ranked = sorted((o for o in tried if o.fits),
                    key=lambda o: (-(o.tokens_per_s if not is_missing(o.tokens_per_s) else -1.0),
                                   not roomy(o.total_bytes, memory), o.gpus, o.total_bytes))
    return tried, ranked, skipped


def _on(label: str, gpus: int) -> str:
    """An option's label on ``gpus`` GPUs (FSDP over them beyond one)."""
    extra = "" if gpus == 1 else f"parallel='fsdp', world_size={gpus}"
    return ", ".join(x for x in (label, extra) if x)


def _expected(opt: Option, expected) -> None:
    """The expected tokens/s per GPU of a whole optimizer step: ``grad_accum`` micro-steps, one update."""
    opt.expected = expected
    if expected is None or not expected.step_s > 0:
        return
    update = sum(r[3] for r in expected.rows if r[1] == "optimizer")
    accum = opt.setting.grad_accum or 1
    tokens = expected.tokens_per_s * expected.step_s
    opt.tokens_per_s = accum * tokens / (accum * (expected.step_s - update) + update)


def caveats(plan_setting, opt: Option, memory: float) -> list:
    """What taking ``opt`` changes beyond memory and speed, as Notes a view or code can tell apart."""
    s, out = opt.setting, []
    if s.weights in HALF and s.weights != plan_setting.weights:
        out.append(Note("advice.numerics", f"pure {s.weights} weights: no fp32 master copy, and AdamW's states are "
                                           f"{s.weights} too; updates smaller than the weights' rounding are lost "
                                           "(changes the numerics: watch the loss against an fp32-weights run)"))
    if s.optimizer != plan_setting.optimizer:
        out.append(Note("advice.optimizer", f"{s.optimizer} instead of {plan_setting.optimizer}: other "
                                            "hyperparameters and convergence (retune the learning rate)"))
    if (s.grad_accum or 1) != (plan_setting.grad_accum or 1):
        out.append(Note("advice.accumulation", f"micro_batch={s.micro_batch} x grad_accum={s.grad_accum}: the same "
                                               "global batch in more micro-steps, one update (tokens/s per update)"))
    if s.parallel and not plan_setting.parallel:
        out.append(Note("advice.gpus", f"FSDP over {s.world_size} GPUs: memory and tokens/s are per GPU, "
                                       f"{s.world_size} to rent"))
    free = memory - opt.total_bytes
    if free < TIGHT * memory:
        out.append(Note("advice.tight", f"leaves {fmt_pct(free / memory)} of the card free (under "
                                        f"{fmt_pct(TIGHT, 0)}): the allocator's fragmentation is not modelled"))
    return out


def pruned_note(skipped: list) -> list:
    """The note saying what was not tried and why (`Skipped`), or none."""
    if not skipped:
        return []
    shown = "; ".join(map(str, skipped[:3])) + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return [Note("advice.pruned", f"{len(skipped)} combination(s) not tried (plan.not_tried): {shown}")]
