"""Command-line options made from the declaration of a step (`core.setting.Setting`,
`core.toggles.declared`): one option per field, with its type, default, help and choices, so a
toggle declared there is an option of ``tunekit run`` and ``tunekit plan`` by itself.

    >>> add_options(parser, Toggles, "toggles")   # --precision, --micro-batch, --checkpointing/--no-checkpointing, ...
"""
from __future__ import annotations

import argparse

from tunekit.core.toggles import declared

LOG, REPORT = "tunekit-runs.jsonl", "tunekit-report.html"   # tunekit run's --log and --report, in the current folder


class DeviceRule:
    """The default of an option whose value is a rule of the device (`core.setting.best_precision`):
    what ``--help`` shows; the command resolves it on its device (`resolved`)."""

    def __str__(self):
        return ("the best precision the device trains in: bf16 where it has a bf16 peak, fp16 on a GPU without "
                "one (V100, T4), fp32 on a CPU")

    __repr__ = __str__


def resolved(value, rule, device: str, bf16: bool | None = None):
    """``value``, or the ``rule``'s for ``device`` where it was left at its `DeviceRule` default."""
    return rule(device, bf16) if isinstance(value, DeviceRule) else value


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_options(p: argparse.ArgumentParser, cls, title: str, defaults: dict | None = None,
                skip: tuple = (), open_choices: tuple = ()) -> None:
    """One option per field of ``cls`` (a Toggles or Setting class) but ``skip``, in a group
    ``title``: its declared default (``defaults`` overrides it; a field with a device rule
    defaults to a `DeviceRule`, shown in --help and resolved by the command: `resolved`), help
    and choices (None left out; ``open_choices``: shown, not enforced: the Setting checks them,
    aliases included)."""
    group = p.add_argument_group(title)
    defaults = defaults or {}
    for t in declared(cls):
        if t.name in skip:
            continue
        default = defaults.get(t.name, DeviceRule() if t.device_default else t.default)
        kw = {"default": default, "help": t.help}
        if t.kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"], kw["metavar"] = t.kind, t.name.upper()
        choices = tuple(c for c in t.choices or () if c is not None)
        if choices:
            kw["metavar"] = "{" + ",".join(choices) + "}"
            if t.name not in open_choices:
                kw["choices"] = choices
        group.add_argument(flag(t.name), dest=t.name, **kw)


def stray(args, parser: argparse.ArgumentParser, parent: str, names: tuple) -> str | None:
    """The refusal of options ``names`` (dests) given away from their ``parser`` default while
    ``parent`` (a dest) is None: each shapes only what ``parent`` makes, so without it the command
    would ignore it in silence. None where there is none such."""
    if getattr(args, parent, None) is not None:
        return None
    given = [flag(n) for n in names if getattr(args, n, parser.get_default(n)) != parser.get_default(n)]
    if not given:
        return None
    return (f"{', '.join(given)} {'act' if given[1:] else 'acts'} only with {flag(parent)}: give {flag(parent)} too, "
            f"or leave {'them' if given[1:] else 'it'} out")
