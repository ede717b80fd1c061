"""The model named on the command line (``--model``), read and checked before any work: shared by
``tunekit run`` (`cli.main`) and ``tunekit plan`` (`tunekit.cli.plan`).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


class Refused(ValueError):
    """Options that cannot run: main() prints the message and exits 2."""


def model_source(text: str, factories: bool = True) -> tuple[str, object]:
    """("preset", name) | ("transformers", config dict) | ("factory", "pkg.mod:fn"); ``factories=False``
    (``tunekit plan``, which builds from a config): a factory is refused before it is imported,
    and a refusal names only a preset or a config file."""
    from tunekit.core.validate import did_you_mean, nearest
    from tunekit.models.gpt_config import PRESETS

    if text in PRESETS:
        return "preset", text
    path = Path(text)
    if path.suffix == ".json" or path.is_file():
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise Refused(f"--model {text}: not a readable JSON file ({e})") from None
        if not isinstance(config, dict) or "model_type" not in config:
            raise Refused(f"--model {text}: a transformers config JSON has a 'model_type' key")
        return "transformers", config
    if text.count(":") == 1 and all(text.split(":")):
        if not factories:
            raise Refused(f"--model {text}: tunekit plan builds the model from a config: a GPT preset or a "
                          "transformers config JSON, not a factory ('package.module:function')")
        check_factory(text)
        return "factory", text
    close = nearest(text, list(PRESETS))
    meant = f"{did_you_mean(close)} (the presets: " if close else " (a preset: "
    raise Refused(f"--model {text!r} is not a preset{meant}{', '.join(PRESETS)}), a config .json file"
                  + (", or 'package.module:function'" if factories else ""))


def check_factory(text: str) -> None:
    """Import ``module:function`` now, from the current directory too (as ``python -m`` would: the
    ``tunekit`` script's own folder is what Python puts first); refused with the path searched."""
    from tunekit.models.spec import factory_problem

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the ranks of a distributed run inherit sys.path
    why = factory_problem(text)
    if why is not None:
        raise Refused(f"--model {text}: {why}")


def search_said(error: Exception, source: tuple[str, object]) -> str:
    """A refusal of ``tunekit run`` in a shell user's words: a step too big for the machine
    (`tunekit.lab.fit.WontFitError`) names the search for the largest micro-batch that fits as a
    command to paste (no CLI flag runs it: ``tunekit plan --search`` plans a GPU, it measures
    nothing); any other refusal as it is."""
    from tunekit.lab.fit import WontFitError

    if not isinstance(error, WontFitError):
        return str(error)
    kind, value = source
    if kind == "preset":
        call = f"from tunekit import Lab; Lab(preset={value!r}).find_max_batch_size()"
    elif kind == "factory":
        module, fn = str(value).split(":")
        call = f"from tunekit import Lab; from {module} import {fn}; Lab({fn}()).find_max_batch_size()"
    else:
        return error.estimate.message(error.what, search="in Python, import tunekit; tunekit.Lab(model)"
                                                         ".find_max_batch_size() to measure the largest "
                                                         "micro-batch that fits")
    return error.estimate.message(error.what, search=f'python -c "{call}" to measure the largest '
                                                     "micro-batch that fits")
