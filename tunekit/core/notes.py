"""Notes with kinds: the words are for people, the kind is what code reads. Pure: no torch.

    >>> n = Note("ckpt.not_applied", "checkpointing requested, but ...: not applied")
    >>> n.kind, str(n)                   # a str: views, joins and JSON dumps show the words alone
    >>> without(report.notes, "ckpt.not_applied", "memory.cpu")   # filter on kinds, never on words

A plain ``str`` in a notes list (the user's, an old log's) has kind None. Every kind is declared
in ``KINDS``: a Note of another kind is refused, so a typo fails where it is made. In a JSON file
a Note is ``{"kind": ..., "text": ...}`` (`to_json` / `from_json`), a plain note its text.
"""

from __future__ import annotations

# kind -> what a note of it says; code reads these codes, so they stay as written
KINDS = {
    "ckpt.not_applied": "checkpointing was asked for, but tunekit does not know the model's blocks",
    "memory.cpu": "measure_memory ran without CUDA: the allocator's figures are not measured",
    "memory.shadow_optimizer": "measure_memory stepped a stand-in optimizer at lr=0",
    "memory.rss_unseen": "a block's allocations moved by more than RSS shows (memory reused or kept by the allocator)",
    "readings.trivial": "a block that runs and makes nothing (`x = 1`): the readings it skipped, its memory among them",
    "measure.page_faults": "a run's timed steps faulted in fresh pages (a heap grown again) for a share of the step",
    "memory.untrimmed": "a CPU peak measured from a start that kept freed heap memory (no glibc malloc_trim)",
    "device.assumed": "estimate_memory planned for this machine's device, none being named",
    "activations.unknown": "estimate_memory has no shape to count the activations with",
    "optimizer.bound": "estimate_memory charged a shape-dependent optimizer state (Adafactor's) its per-param bound",
    "flops.uncounted": "ops without a FLOP formula, left out of the count",
    "flops.mask_unread": "attention masks without values (fake tensors): counted model FLOPs may keep a masked half",
    "rates.none": "why a run reports no TFLOPS/MFU (its time is slowed, or no peak is known)",
    "trace.snapshot": "the allocator snapshot: not written, or older ones pruned",
    "device.no_peak": "a plan's device lists no peak for its dtype: no speed bound, and what the card runs instead",
    "plan.sliding_window": "a sliding attention window planned as full causal attention (sdpa/eager mask it): "
                           "it saves nothing there; flash_attention_2 would use it",
    "plan.attention_kernel": "which of torch's CUDA SDPA kernels a GPU plan names for attention, by what rule",
    "expected.missing": "a plan's device lacks a figure its expected step needs: the bound stands alone",
    "expected.other_precision": "a plan's device has an expected step in another precision: how to plan in it",
    "expected.busy_figures": "a plan's expected step comes from figures calibrated on a busy machine",
    "expected.borrowed": "a plan's device borrows a figure from the nearest measured card of its chip and memory",
    "advice.numerics": "a planned change that changes the numerics (pure half weights, half AdamW states)",
    "advice.optimizer": "a planned change of optimizer: other hyperparameters and convergence",
    "advice.accumulation": "a planned micro-batch split over accumulation steps (same global batch)",
    "advice.gpus": "a planned change that shards the step over several GPUs",
    "advice.tight": "a planned setting leaving under 5% of the card free: fragmentation is not modelled",
    "advice.pruned": "combinations of changes not tried, and why: each adds changes or GPUs to one that fits with room",
    "advice.not_searched": "what the advice never tries (other parallelisms, offload, fp8, more nodes, ...), in words",
    "toggle.over_hand_change": "a toggle given explicitly replaced a change made to the model by hand",
    "conditions.shared_node": "a cluster run's nodes ran other jobs while it measured (the scheduler said so)",
    "autotune.unconfirmed": "a candidate measured faster than the winner without winning its race",
    "explain.busy": "tunekit.explain: the traced run was measured on a busy machine",
    "explain.profiler": "tunekit.explain: the profiler's own overhead is part of the gaps",
    "explain.none": "a traced run without its one line against the expected step, and why",
    "explain.where": "tunekit.explain of a cluster run: the job, its nodes, each rank's node and CPUs",
    "explain.untraced": "tunekit.explain of an untraced (cluster) run: the whole step only",
    "monitor.untraced": "Monitor(trace=N): no step traced (the loop ended first, the step failed, no profiler)",
    "diff.failed_run": "tunekit.diff: a run that did not finish, its figures n/a",
    "diff.same_run": "tunekit.diff: both sides are one run",
    "diff.peaks": "tunekit.diff: the two sides' MFUs are against different peaks (their own dtypes')",
    "diff.busy": "tunekit.diff: a side measured on a busy machine",
    "diff.one_trace": "tunekit.diff: one side traced, the other not",
    "diff.devices": "tunekit.diff: traces from two kinds of device",
    "diff.top_ops": "tunekit.diff: added/removed ops are among the ops each trace kept",
    "diff.profiler": "tunekit.diff: the profiler slowed a traced step: its categories are not the step time's",
    "run.expect_stopped": "lab.run stopped the dashboard's expectation line planning beside it before it measured",
    "expect.uncalibrated": "lab.expect: no measured run of the Lab on its device, the device model alone",
    "expect.step_only": "lab.expect: the base run calibrates by its step time alone (one ratio for the step)",
    "expect.new_ops": "lab.expect: ops the base run did not have, at the device model uncalibrated",
    "expect.not_carried": "lab.expect: measured time the base plan foresaw nothing for, carried as measured",
    "expect.other_dtype": "lab.expect: ops whose kernels run at other dtypes than the base measured: its step's factor",
    "expect.outlier": "lab.expect: a traced factor far over its group's (a group: the others') not carried",
    "expect.kept": "lab.expect: base-run time no op's factor carries (outliers), kept as measured in every setting",
    "expect.peak_uncalibrated": "lab.expect: the base run measured no peak, the plan's peak alone",
    "expect.busy": "lab.expect: the base run was measured on a busy machine",
    "expect.peak_offset": "lab.expect: the CPU peak carried as one offset (no start reading)",
    "expect.first_use": "lab.expect: kernels not yet run here: what a CPU kernel library keeps once per process",
    "expect.wont_fit": "lab.expect: the setting's peak needs more memory than is available: lab.run refuses it",
    # find_max_batch_size's trial reasons (Trial.reason)
    "trial.ok": "the trial fit",
    "trial.oom": "the trial ran out of memory",
    "trial.over_budget": "the trial's peak was above the memory budget",
    "trial.over_available": "the trial's peak was above the memory available",
    "trial.predicted_over_budget": "not run: predicted above the memory budget",
    "trial.predicted_over_available": "not run: predicted above the memory available",
}


def _declared(kinds) -> tuple:
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"undeclared note kind(s) {unknown}: declare them in tunekit.core.notes.KINDS")
    return tuple(kinds)


class Note(str):
    """A note's words (a ``str``, so it prints, joins and compares as them) and its ``kind``.
    ``str`` methods (``upper``, ``+``, ``join``) give plain strings: the words without the kind."""

    kind: str

    def __new__(cls, kind: str, text: str) -> "Note":
        _declared([kind])
        self = super().__new__(cls, text)
        self.kind = kind
        return self

    def __reduce__(self):  # pickle, copy and deepcopy (dataclasses.asdict) keep the kind
        return Note, (self.kind, str(self))


def kind_of(note) -> str | None:
    """A note's kind; None for a plain string."""
    return getattr(note, "kind", None)


def of_kind(notes, *kinds: str) -> list:
    """The notes of these kinds, in order. Example: ``of_kind(rec.notes, "rates.none")``."""
    kinds = _declared(kinds)
    return [n for n in notes if kind_of(n) in kinds]


def without(notes, *kinds: str) -> list:
    """The notes of other kinds (plain strings included), in order."""
    kinds = _declared(kinds)
    return [n for n in notes if kind_of(n) not in kinds]


def to_json(note):
    """What a JSON file keeps of a note: ``{"kind", "text"}`` for a Note, a plain note as it is."""
    return {"kind": note.kind, "text": str(note)} if isinstance(note, Note) else note


def is_json_note(v) -> bool:
    """Whether a value read from JSON is a note `from_json` takes: a string or a kind with its text."""
    return isinstance(v, str) or (isinstance(v, dict) and set(v) == {"kind", "text"}
                                  and isinstance(v["text"], str) and isinstance(v["kind"], (str, type(None))))


def from_json(v):
    """The note a JSON file kept (`to_json`'s inverse). A kind this tunekit does not declare (a
    newer one wrote it) leaves the words, as a plain string."""
    if isinstance(v, dict) and is_json_note(v):
        return Note(v["kind"], v["text"]) if v["kind"] in KINDS else v["text"]
    return v


def encoded(value):
    """``value`` with every Note inside its lists and dicts as `to_json` keeps it (for json.dumps)."""
    if isinstance(value, Note):
        return to_json(value)
    if isinstance(value, dict):
        return {k: encoded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encoded(v) for v in value]
    return value


def decoded(value):
    """`encoded`'s inverse: every ``{"kind", "text"}`` inside lists and dicts back as a Note."""
    if isinstance(value, dict):
        return from_json(value) if is_json_note(value) else {k: decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decoded(v) for v in value]
    return value
