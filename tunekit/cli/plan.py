"""``tunekit plan``: what a training step needs on a GPU of the spec table, and how fast it could
possibly go, from a shell, without running the model (`tunekit.plan`).

    tunekit plan --model llama3-8b.json --device "H100 SXM" --precision bf16 --weights bf16 \\
                 --micro-batch 1 --seq-len 8192 --checkpointing [--search]
    tunekit plan --model llama3-8b.json --device "H100 SXM" --parallel fsdp --world-size 8 ...

Exit 0: the step fits; 1: it does not (the plan says by how much); 2: refused before any work.
"""
from __future__ import annotations

import argparse
import importlib.util
from dataclasses import fields

from tunekit.cli.model import Refused, model_source
from tunekit.cli.options import add_options, resolved, stray
from tunekit.core import gpus, specs
from tunekit.core.extras import missing_extra
from tunekit.core.setting import Setting
from tunekit.core.toggles import declared


def plan_parser(parser_class=argparse.ArgumentParser, formatter=argparse.HelpFormatter) -> argparse.ArgumentParser:
    """``tunekit plan``'s options: one per field of `core.setting.Setting` (cli.options), with
    plan's own defaults (`core.setting.PLAN_DEFAULTS`, its device; the precision: the device's)."""
    from tunekit.core.gpus import DEFAULT_DEVICE
    from tunekit.core.setting import PLAN_DEFAULTS

    p = parser_class(prog="tunekit plan", add_help=False, formatter_class=formatter,
                     description="Plan one training step on a device without running it: memory per component, "
                                 "whether it fits, and a speed-of-light bound (tunekit.plan).")
    p.add_argument("-h", "--help", action="help", help="show this help message and exit")
    p.add_argument("--model", default="cpu-tiny",
                   help="a GPT preset or a transformers config JSON file")
    p.add_argument("--device", default=DEFAULT_DEVICE,
                   help="a GPU of the table (" + ", ".join(specs.names()) + "), a short name ("
                        + ", ".join(gpus.ALIASES) + ") or cpu")
    add_options(p, Setting, "the step (tunekit.Setting)", defaults=PLAN_DEFAULTS, skip=("model", "device"),
                open_choices=("optimizer", "attention"))
    p.add_argument("--search", action="store_true", help="also find the largest micro-batch that fits")
    p.add_argument("--sbatch", metavar="FOLDER", default=None,
                   help="also write the batch script that runs this setting on Slurm into FOLDER (job.sh)")
    p.add_argument("--partition", default=None, help="with --sbatch: the Slurm partition; None: the cluster's default")
    p.add_argument("--time", default="00:30:00", help="with --sbatch: the job's time limit")
    p.add_argument("--option", type=int, default=None,
                   help="with --sbatch: the advice's option N (0: the first) instead of the planned setting")
    return p


def setting_of(args) -> Setting:
    """The step the command line describes, as every API takes it (the precision the device's
    rule where none is given)."""
    words = {f.name: getattr(args, f.name) for f in fields(Setting)}
    rules = {t.name: t.device_default for t in declared(Setting) if t.device_default}
    return Setting(**{k: resolved(v, rules.get(k), args.device) for k, v in words.items()})


def plan_main(args) -> int:
    """Run ``tunekit plan`` on parsed ``args``; the exit status."""
    from tunekit.view.progress import wait_progress

    try:
        if why := stray(args, plan_parser(), "sbatch", ("partition", "time", "option")):
            raise Refused(why)
        kind, value = model_source(args.model, factories=False)
        if args.device.strip().lower() != "cpu":   # a card the table lacks: refused before torch's import (seconds)
            specs.card(args.device)
        if kind != "preset" and importlib.util.find_spec("transformers") is None:   # the same, for the extra
            raise missing_extra(ModuleNotFoundError(name="transformers"), "--model with a transformers config JSON")
        # torch's and transformers' imports are seconds of a plan's wait: shown as its first stage
        with wait_progress("tunekit plan", True) as shown:
            shown.at("importing torch" + (" and transformers" if kind != "preset" else ""))
            from tunekit.planning.planner import plan

            if kind == "preset":
                from tunekit.models.gpt import GPTConfig

                cfg = GPTConfig.preset(value)
            else:
                try:
                    from transformers import AutoConfig
                except ModuleNotFoundError as e:
                    raise (missing_extra(e, "--model with a transformers config JSON") or e) from None

                config = dict(value)
                cfg = AutoConfig.for_model(config.pop("model_type"), **config)
            p = plan(cfg, setting=setting_of(args), search=args.search)
    except (Refused, ValueError, TypeError, ImportError) as e:
        import sys

        print(f"tunekit plan: error: {e}", file=sys.stderr)
        return 2
    print(p)
    if args.sbatch is not None:
        from tunekit.parallel.slurm import Slurm

        try:
            if args.option is not None and not 0 <= args.option < len(p.advice):
                raise ValueError(f"--option {args.option}: the plan's advice has {len(p.advice)} option(s)"
                                 + ("" if p.advice else " (it lists options only when the step does not fit)"))
            path = p.sbatch(Slurm(partition=args.partition, time=args.time), args.sbatch, model=args.model,
                            option=args.option)
        except (ValueError, IndexError) as e:
            import sys

            print(f"tunekit plan: --sbatch: {e}", file=sys.stderr)
            return 2
        print(f"batch script: {path} (sbatch {path})")
    return 0 if p.fits else 1
