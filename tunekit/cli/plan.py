"""``tunekit plan``: what a training step needs on a GPU of the spec table, and how fast it could
possibly go, from a shell, without running the model (`tunekit.plan`).

    tunekit plan --model llama3-8b.json --device "H100 SXM" --precision bf16 --weights bf16 \\
                 --micro-batch 1 --seq-len 8192 --checkpointing [--search]
    tunekit plan --model llama3-8b.json --device "H100 SXM" --parallel fsdp --world-size 8 ...

Exit 0: the step fits; 1: it does not (the plan says by how much); 2: refused before any work.
"""
from __future__ import annotations

import argparse

from tunekit.cli.model import Refused, model_source
from tunekit.core import gpus, registry, specs
from tunekit.core.extras import missing_extra
from tunekit.core.setting import HALF, PARALLEL, Setting


def plan_parser(parser_class=argparse.ArgumentParser, formatter=argparse.HelpFormatter) -> argparse.ArgumentParser:
    p = parser_class(prog="tunekit plan", add_help=False, formatter_class=formatter,
                     description="Plan one training step on a device without running it: memory per component, "
                                 "whether it fits, and a speed-of-light bound (tunekit.plan).")
    p.add_argument("-h", "--help", action="help", help="show this help message and exit")
    p.add_argument("--model", default="cpu-tiny",
                   help="a GPT preset or a transformers config JSON file")
    p.add_argument("--device", default=gpus.DEFAULT_DEVICE,
                   help="a GPU of the table (" + ", ".join(specs.names()) + "), a short name ("
                        + ", ".join(gpus.ALIASES) + ") or cpu")
    p.add_argument("--precision", choices=tuple(registry.PRECISIONS), default="bf16",
                   help="training precision; bf16/fp16 under autocast")
    p.add_argument("--weights", choices=("fp32",) + HALF, default=None,
                   help="the parameters' dtype; none: fp32, with master weights under autocast")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence; none: the model's maximum")
    p.add_argument("--checkpointing", action="store_true", help="recompute each block in backward")
    p.add_argument("--optimizer", default="adamw", help="adamw | sgd | adafactor | ...")
    p.add_argument("--attention", default=None, help="sdpa | math | flash; none: the model's own")
    p.add_argument("--parallel", choices=PARALLEL, default=None,
                   help="plan one rank of a sharded run; none: one device")
    p.add_argument("--world-size", type=int, default=1, help="GPUs in all, with --parallel")
    p.add_argument("--nodes", type=int, default=1, help="nodes they are spread over")
    p.add_argument("--search", action="store_true", help="also find the largest micro-batch that fits")
    return p


def setting_of(args) -> Setting:
    """The step the command line describes, as every API takes it."""
    return Setting(model=args.model, device=args.device, precision=args.precision, weights=args.weights,
                   micro_batch=args.micro_batch, seq_len=args.seq_len, checkpointing=args.checkpointing,
                   optimizer=args.optimizer, attention=args.attention, parallel=args.parallel,
                   world_size=args.world_size, nodes=args.nodes)


def plan_main(args) -> int:
    """Run ``tunekit plan`` on parsed ``args``; the exit status."""
    from tunekit.planning.planner import plan

    try:
        kind, value = model_source(args.model)
        if kind == "factory":
            raise Refused("--model: tunekit plan builds the model from a config: a GPT preset or a "
                          "transformers config JSON, not a factory")
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
    return 0 if p.fits else 1
