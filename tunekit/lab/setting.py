"""A `tunekit.Setting` read by a Lab: the toggles of a run and its layout over ranks, and what a
live model cannot be given.

    >>> changes, (parallel, nproc, nodes) = lab_keywords(lab, Setting(precision="bf16"), {}, (None, 1, 1))
"""
from __future__ import annotations

from tunekit.core.setting import Setting, Toggles, choices_of, from_keywords, step_words
from tunekit.core.toggles import ToggleError
from tunekit.core.validate import DEVICE_TYPES
from tunekit.measure.device import weights_dtype
from tunekit.models.gpt import PRESETS

# what the Lab's keywords take, for the help a value given to the wrong one gets (validate.meant):
# ``Lab("gpt2-124m")`` -> did you mean preset='gpt2-124m'?
LAB_CHOICES = {"model": lambda v: not isinstance(v, str) or ":" in v, "preset": tuple(PRESETS),
               "device": lambda v: isinstance(v, str) and v.partition(":")[0] in DEVICE_TYPES,
               **choices_of(Toggles)}


def lab_keywords(lab, setting: Setting, changes: dict, layout: tuple, parallel: bool = True,
                 api: str = "lab.run") -> tuple[dict, tuple]:
    """(toggles, (parallel, nproc, nodes)) of ``lab.run(setting=...)``: one description per
    call (toggle keywords or a layout given beside the Setting are refused); ``ToggleError`` for
    what the Lab cannot do with its live model (other weights, another device, another model).
    A Setting is complete: its toggles replace the Lab's defaults, except those it leaves None
    (attention, seq_len: the model's own), which keep the Lab's."""
    kind, nproc, nodes = layout
    given = dict(changes, parallel=kind, world_size=None if nproc == 1 else nproc, nodes=None if nodes == 1 else nodes)
    s = from_keywords(setting, api, **given)
    why = []
    live = weights_dtype(lab.model.parameters())
    if s.weights is not None and s.weights != live:
        why.append(f"weights={s.weights!r}: the Lab trains its live model in the dtype it has ({live}); converting "
                   "it would round its weights. Plan it instead (tunekit.plan(lab, setting=s)) or give the Lab a "
                   f"model in {s.weights}.")
    if s.device is not None and s.device not in (lab.device.type, str(lab.device)):
        why.append(f"device={s.device!r}: this Lab's model is on {lab.device}; plan another device with "
                   "tunekit.plan(lab, setting=s).")
    if s.model is not None:
        why.append(f"model={s.model!r}: a Lab trains the model it was made with; Setting.model names what the "
                   "tunekit command builds.")
    if s.parallel is not None and not parallel:
        why.append(f"parallel={s.parallel!r}: this searches one process; run the ranks with lab.run(setting=s).")
    if why:
        raise ToggleError(why)
    toggles = {k: getattr(s, k) for k in step_words(Toggles) if getattr(s, k) is not None}
    return toggles, (s.parallel, s.world_size // s.nodes, s.nodes)
