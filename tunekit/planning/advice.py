"""What to change when a planned step does not fit: COMBINATIONS of changes (checkpointing, half
weights, an optimizer with less state for AdamW (bitsandbytes' 8-bit AdamW, then SGD), the micro-batch
halved with the accumulation doubled to keep the global batch), each tried over the plan's fake
steps and placed on the plan's own GPUs and on FSDP over more (`placements`: 2, 4, 8 GPUs in a node,
then 16 and 32 over 2 and 4 nodes, the collectives crossing nodes on the card's node network); those
that fit ranked by their EXPECTED tokens/s per GPU, each with its caveats (`core.notes.Note`, kinds
``advice.*``).

Reuse: the planner caches a model per weight dtype; a change that only moves the placement (FSDP
over N) places a step already faked (no fake step more). A combination that fits WITH ROOM (at
least `TIGHT` of the card free) prunes what could only cost more: the combinations adding changes
to it (each costs speed, numerics or convergence) and more GPUs for it (more to rent). A TIGHT fit
prunes nothing: its neighbours (more GPUs, checkpointing, ...) are tried, since the allocator's
fragmentation may not leave it its last few percent. The search is bounded: at most `MAX_FAKED`
fake steps, fewest changes first. What was not tried is listed (`Skipped`: which combination, on
which GPUs, why, and the fit that made it pointless), and so is what the search never tries
(`NOT_SEARCHED`, in words). A step is counted op by op (for its expected speed and its FLOPs per
token) only when it fits somewhere: an option that does not fit has no FLOPs per token (NaN).

The search itself is pure: the planner hands it callables that fake, count, place and expect.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from tunekit.core.fmt import fmt_pct
from tunekit.core.notes import Note
from tunekit.core.registry import FP32
from tunekit.core.setting import HALF
from tunekit.core.units import is_missing

NaN = math.nan
PER_NODE = 8         # GPUs a node holds where the plan does not say (an HGX/DGX board of 8)
MAX_NODES = 4        # FSDP over at most this many nodes
MAX_FAKED = 24       # the most fake steps one advice makes: its time's bound (the rest: Skipped, "bound")
TIGHT = 0.05         # a setting that leaves less than this share of the card free is flagged
# AdamW's state (8 or 4 bytes a parameter) for less, least change first: bitsandbytes' 8-bit moments
# (2 bytes a parameter and a fp32 scale per 256: the same hyperparameters), then SGD with momentum
# (one buffer: other hyperparameters). Each level's state is no larger than the one before.
LESS_STATE = {"adamw": ("adamw_8bit", "sgd"), "adamw_fused": ("adamw_8bit", "sgd")}
# what the search never tries, in words (the note of kind advice.not_searched)
NOT_SEARCHED = (
    "tensor, pipeline, sequence or context parallelism and expert sharding (not modelled)",
    "CPU or NVMe offload of the weights, gradients or optimizer state (not modelled)",
    "selective checkpointing (only all blocks or none) and a shorter seq_len (it changes what is trained)",
    "fp8 matmuls and pure fp32 (weights: the plan's or the half precision only)",
    "HSDP (it holds per GPU what FSDP over one node holds: it fits where FSDP over a node fits, and its "
    "speed is planned with parallel='hsdp')",
    f"more than {MAX_NODES} nodes, and other optimizers (adafactor: its step reads values, which a fake step "
    "cannot; lion: one state, as SGD's)",
)


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
    """Each change's levels: [(labels, Setting changes)], level 0 the plan's own. Within a dimension a
    higher level changes more (the search's pruning reads it so)."""
    dims = []
    if not setting.checkpointing:
        dims.append([((), {}), (("checkpointing=True",), dict(checkpointing=True))])
    if setting.weights in (None, FP32) and setting.precision in HALF:
        dims.append([((), {}), ((f"weights={setting.precision!r}",), dict(weights=setting.precision))])
    less = [o for o in LESS_STATE.get(setting.optimizer, ()) if not (o == "adamw_8bit" and setting.device == "cpu")]
    if less:   # bitsandbytes' 8-bit AdamW runs on CUDA only
        dims.append([((), {})] + [((f"optimizer={o!r}",), dict(optimizer=o)) for o in less])
    levels, mb, accum = [((), {})], setting.micro_batch, setting.grad_accum or 1
    while mb % 2 == 0:   # the same global batch: micro_batch halved, grad_accum doubled
        mb, accum = mb // 2, accum * 2
        levels.append(((f"micro_batch={mb}, grad_accum={accum}",), dict(micro_batch=mb, grad_accum=accum)))
    if len(levels) > 1:
        dims.append(levels)
    return dims


@dataclass(frozen=True)
class Place:
    """Where a combination is placed: the plan's own GPUs (``changes`` empty) or FSDP over
    ``world`` GPUs on ``nodes`` nodes."""

    world: int
    nodes: int = 1
    changes: tuple = ()     # plan's keywords ("parallel='fsdp', world_size=16, nodes=2",)
    parallel: str | None = None

    def __str__(self) -> str:
        if not self.changes:
            return "one GPU" if self.parallel is None else f"the plan's {self.parallel} over {self.world}"
        return f"FSDP over {self.world}" + (f" on {self.nodes} nodes" if self.nodes > 1 else "")

    def on(self, s):
        """``s`` placed here."""
        return s.replace(parallel="fsdp", world_size=self.world, nodes=self.nodes) if self.changes else s


def placements(setting, sharding: bool) -> list:
    """Where each combination is tried: the plan's own GPUs first, then (``sharding``) FSDP over the
    plan's count (when its layout is not FSDP already) and its doublings (one GPU: 2, 4, 8, ...), up
    to `MAX_NODES` nodes of the plan's GPUs a node (`PER_NODE` where it names one node)."""
    world, nodes = (setting.world_size, setting.nodes) if setting.parallel else (1, 1)
    out = [Place(world, nodes, (), setting.parallel)]
    if not sharding:
        return out
    per_node = world // nodes if nodes > 1 else max(PER_NODE, world)
    n = max(2, world if setting.parallel not in (None, "fsdp") else 2 * world)   # FSDP over 1 shards nothing
    while n <= per_node * MAX_NODES:
        k = -(-n // per_node)
        if n % k == 0:
            out.append(Place(n, k, (f"parallel='fsdp', world_size={n}" + (f", nodes={k}" if k > 1 else ""),), "fsdp"))
        n *= 2
    return out


@dataclass(frozen=True)
class Skipped:
    """A combination of changes not tried on the placements ``on`` (`Place`), and why: ``why`` one
    of `SKIPPED` (a code), ``by`` the label of what made it pointless."""

    changes: str
    on: tuple
    why: str
    by: str = ""

    @property
    def gpus(self) -> tuple:
        """The GPU counts of ``on``."""
        return tuple(p.world for p in self.on)

    def __str__(self) -> str:
        words = [str(p) for p in self.on]
        fsdp = [p for p in self.on if p.changes]
        if len(fsdp) > 1:   # "FSDP over 2, 4, 8, 16 (2 nodes)"
            words = [w for w, p in zip(words, self.on) if not p.changes] + [
                "FSDP over " + ", ".join(f"{p.world}" + (f" ({p.nodes} nodes)" if p.nodes > 1 else "") for p in fsdp)]
        on = " or ".join(words)
        return f"{self.changes or 'the plan'} on {on}: {SKIPPED[self.why].format(by=self.by)}"


SKIPPED = {"adds_to_fit": "adds changes to {by}, which fits with room (each costs speed, numerics or convergence)",
           "more_gpus": "{by} already fits with room on as many GPUs or fewer (more GPUs: more to rent)",
           "not_faked": "a fake step cannot take it ({by})",
           "bound": "the search's bound ({by} fake steps made, fewest changes first): plan it yourself"}


def roomy(total: float, memory: float) -> bool:
    """Fits with at least `TIGHT` of the card free (what prunes other combinations)."""
    return memory - total >= TIGHT * memory


def search_changes(setting, base_step, memory: float, *, fake, count, place, expect, places, limit=MAX_FAKED):
    """(every Option tried, the Options that fit best first, the `Skipped`).

    ``fake(s) -> step``, not counted (raises ValueError for a step it cannot fake); ``count(s, step)``:
    the step counted op by op; ``place(step, s) -> Placed`` (``.total``, ...) with ``s.parallel`` the
    layout; ``expect(step, s, placed) -> Expected | None``. ``places``: `placements`, the plan's own
    first. ``limit``: the most fake steps made (the plan's own step is given).

    The ranking: expected tokens/s per GPU, fastest first; at equal speed a fit with room before a
    tight one, then fewer GPUs, then fewer bytes. So the first pick is tight only when it is faster
    than every fit with room; one with room that is as fast or faster comes first. Options without
    an expectation come last."""
    dims = dimensions(setting)
    base = (0,) * len(dims)
    combos = [base] + sorted((c for c in itertools.product(*(range(len(d)) for d in dims)) if c != base),
                             key=lambda c: (sum(c), c))
    roomy_fits, tried, skipped, names, faked = [], [], [], {}, 0
    per_token = base_step.executed / setting.micro_batch
    for combo in combos:
        labels = sum((dims[i][lv][0] for i, lv in enumerate(combo)), ())
        label = names[combo] = ", ".join(labels)
        change = {k: v for i, lv in enumerate(combo) for k, v in dims[i][lv][1].items()}
        # the fewest placements at which a subset of these changes already fits with room: more is not tried
        cap, by = min(((g, c) for c, g in roomy_fits if c != combo and all(a <= b for a, b in zip(c, combo))),
                      default=(len(places), None))
        if cap == 0:
            skipped.append(Skipped(label, tuple(places), "adds_to_fit", names[by]))
            continue
        if combo != base and faked >= limit:
            skipped.append(Skipped(label, tuple(places[:cap]), "bound", str(limit)))
            continue
        s = setting.replace(**change)
        try:
            step = base_step if combo == base else fake(s)
        except ValueError as e:   # a change that cannot be faked is not offered (refused before any pass)
            skipped.append(Skipped(label, tuple(places[:cap]), "not_faked", str(e)))
            continue
        faked += combo != base
        own = _placed_options(setting, s, combo == base, labels, step, places[:cap], memory, per_token,
                              tried, fake=fake, count=count, place=place, expect=expect)
        if own is not None:
            roomy_fits.append((combo, own))
            if own + 1 < len(places):
                skipped.append(Skipped(label, tuple(places[own + 1:]), "more_gpus", _on(label, places[own])))
        elif cap < len(places):
            skipped.append(Skipped(label, tuple(places[cap:]), "more_gpus", _on(names[by], places[cap])))
    ranked = sorted((o for o in tried if o.fits),
                    key=lambda o: (-(o.tokens_per_s if not is_missing(o.tokens_per_s) else -1.0),
                                   not roomy(o.total_bytes, memory), o.gpus, o.total_bytes))
    return tried, ranked, skipped


def _placed_options(setting, s, is_base, labels, step, places, memory, per_token, tried, *, fake, count, place,
                    expect) -> int | None:
    """One combination ``s`` placed on each of ``places`` in turn, each an Option appended to ``tried``,
    until one fits with room: its index (None: none did)."""
    for g, where in enumerate(places):
        if is_base and g == 0:
            continue   # the plan itself
        sg = where.on(s)
        placed = place(step, sg)
        fits = placed.total <= memory
        opt = Option(labels + where.changes, sg, placed.total, fits)
        if fits and not step.has("ops"):
            count(s, step)
        if step.executed is not None:
            opt.flops_per_token = step.executed / s.micro_batch / per_token
        if fits:
            _expected(opt, expect(step, sg, placed))
            opt.notes = caveats(setting, opt, memory)
        tried.append(opt)
        if fits and roomy(opt.total_bytes, memory):
            return g
    return None


def changed_words(plan_setting, s) -> str:
    """What a combination the advice tries changes, in ``plan``'s keywords."""
    return ", ".join(f"{f}={getattr(s, f)!r}" for f in ("checkpointing", "weights", "optimizer", "micro_batch",
                                                       "grad_accum") if getattr(s, f) != getattr(plan_setting, f))


def _on(label: str, where: Place) -> str:
    """An option's label on a placement."""
    return ", ".join(x for x in (label, *where.changes) if x)


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
    if s.optimizer == "adamw_8bit" and plan_setting.optimizer != "adamw_8bit":
        out.append(Note("advice.optimizer", f"adamw_8bit instead of {plan_setting.optimizer}: bitsandbytes' AdamW8bit "
                                            "(pip install bitsandbytes; CUDA only), its moments in 8 bits block by "
                                            "block: AdamW's hyperparameters, numerics close to its (watch the loss)"))
    elif s.optimizer != plan_setting.optimizer:
        out.append(Note("advice.optimizer", f"{s.optimizer} instead of {plan_setting.optimizer}: other "
                                            "hyperparameters and convergence (retune the learning rate)"))
    if (s.grad_accum or 1) != (plan_setting.grad_accum or 1):
        out.append(Note("advice.accumulation", f"micro_batch={s.micro_batch} x grad_accum={s.grad_accum}: the same "
                                               "global batch in more micro-steps, one update (tokens/s per update)"))
    if (s.parallel, s.world_size, s.nodes) != (plan_setting.parallel, plan_setting.world_size, plan_setting.nodes):
        across = (f" on {s.nodes} nodes of {s.world_size // s.nodes} (the collectives cross nodes on the node's "
                  "network)") if s.nodes > 1 else ""
        out.append(Note("advice.gpus", f"FSDP over {s.world_size} GPUs{across}: memory and tokens/s are per GPU, "
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


def not_searched_note() -> Note:
    """The note saying what the advice never tries (`NOT_SEARCHED`)."""
    return Note("advice.not_searched", "the advice does not try: " + "; ".join(NOT_SEARCHED))
