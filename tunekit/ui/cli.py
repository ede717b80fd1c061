"""The ``tunekit`` command: train a model under the Lab's toggles from a shell. UI layer.

    tunekit run --precision bf16 --micro-batch 16 --steps 20          # one process, here
    tunekit run --parallel fsdp --nproc 2                              # 2 ranks on this machine
    tunekit run --parallel hsdp --nproc 2 --nodes 2 --link-bandwidth 50mbit   # emulated nodes
    torchrun --nnodes 2 --nproc-per-node 4 ... -m tunekit run --parallel hsdp --log-path runs.jsonl

Every run is appended to a JSONL log (``--log``) and the log's runs are drawn in a self-contained
HTML report (``--report``). The options of ``tunekit run`` are made from the fields of
``tunekit.core.toggles.Toggles`` and the registry's choices, so a new toggle appears by itself.
Bad options end with one line on stderr and exit code 2 before any work; a run that fails exits 1.
Parse, call, display: the Lab and the distributed engine measure, this module only prints.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing
from pathlib import Path

from ..core import comm
from ..core import toggles as tg
from ..core.bounds import WORDS, mark
from ..core.summary import FORMATS, formatted
from ..core.units import fmt_bytes, fmt_pct, fmt_seconds

PARALLEL = ("none", *comm.PARALLEL)  # the distributed engine's kinds, plus "none" (one process)
CHOICES = {"precision": tg.PRECISIONS, "optimizer": tg.OPTIMIZERS, "attention": tg.ATTENTIONS}
HELP = {"precision": "training precision", "checkpointing": "recompute each block in backward",
        "micro_batch": "samples per micro-step (per rank)", "grad_accum": "micro-steps per optimizer step",
        "seq_len": "tokens per sample; None: the model's position limit",
        "optimizer": "optimizer", "attention": "attention kernel; None: the model's own",
        "compile": "torch.compile the model", "lr": "learning rate"}
STEPS, WARMUP = 20, 2            # as lab.run
LOG, REPORT = "tunekit-runs.jsonl", "tunekit-report.html"
TORCHRUN_ENV = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage block first)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _toggle_options(p: argparse.ArgumentParser) -> None:
    """One option per Toggles field, typed from its annotation, defaulting to its default."""
    hints = typing.get_type_hints(tg.Toggles)
    group = p.add_argument_group("toggles (tunekit.core.toggles.Toggles)")
    for f in dataclasses.fields(tg.Toggles):
        kind = next((a for a in typing.get_args(hints[f.name]) if a is not type(None)), hints[f.name])
        kw = {"default": f.default, "help": HELP.get(f.name, f"the Lab's {f.name} toggle")}
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = kind
            kw["metavar"] = f.name.upper()
        if f.name in CHOICES:
            kw["choices"], kw["metavar"] = CHOICES[f.name], "{" + ",".join(CHOICES[f.name]) + "}"
        group.add_argument(_flag(f.name), dest=f.name, **kw)


def run_parser() -> argparse.ArgumentParser:
    from ..models.gpt import PRESETS

    p = _Parser(prog="tunekit run", formatter_class=_Formatter,
                description="Train a model for --steps timed steps under the given toggles; print "
                            "what was measured, append it to --log and redraw --report.")
    p.add_argument("--steps", type=int, default=STEPS, help="timed steps")
    p.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps first")
    p.add_argument("--model", default="cpu-tiny",
                   help=f"a GPT preset ({', '.join(PRESETS)}), a transformers config JSON file, or "
                        "'package.module:function' returning the model")
    _toggle_options(p)
    d = p.add_argument_group("distributed (torch.distributed; under torchrun the job's layout is used)")
    d.add_argument("--parallel", choices=PARALLEL, default="none",
                   help="none: one process; ddp; fsdp (FULL_SHARD); fsdp_grad_op (SHARD_GRAD_OP); "
                        "hsdp (HYBRID_SHARD: shard within a node, replicate across nodes)")
    d.add_argument("--nproc", type=int, default=None, help="ranks per node; None: 1, or the torchrun job's")
    d.add_argument("--nodes", type=int, default=None, help="nodes; None: 1, or the torchrun job's")
    d.add_argument("--link-bandwidth", default=None,
                   help="emulate nodes in network namespaces joined by a link of this rate, e.g. 50mbit "
                        "(needs root); None: no emulated link")
    d.add_argument("--link-latency", default=None,
                   help="one-way latency of that link, e.g. 1ms; None: 1ms when a link is emulated")
    o = p.add_argument_group("output")
    # --log-path too: torchrun's own parser stops at --log (a prefix of its --log-dir and --logs-specs)
    o.add_argument("--log", "--log-path", dest="log", default=LOG,
                   help="JSONL run log, appended to (under torchrun write --log-path)")
    o.add_argument("--report", default=REPORT, help="HTML report of every run in the log (self-contained)")
    return p


def version_line() -> str:
    """``tunekit 0.1.0 (torch 2.x, Python 3.11.7)``: what a bug report needs, without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    return f"tunekit {__version__} (torch {torch_version}, Python {sys.version.split()[0]})"


def parser() -> argparse.ArgumentParser:
    run = run_parser()
    p = _Parser(prog="tunekit", formatter_class=_Formatter,
                description="tunekit from a shell. Commands: run (train and measure; "
                            "`tunekit run --help`). The options of run, with their defaults:",
                epilog=run.format_help())
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", metavar="{run}", parser_class=_Parser)
    sub.add_parser("run", parents=[run], add_help=False, formatter_class=_Formatter,
                   description=run.description, help="train and measure one configuration")
    return p


# --- checks: all before any work --------------------------------------------------------------


class Refused(ValueError):
    """Options that cannot run: main() prints the message and exits 2."""


def under_torchrun(env=None) -> bool:
    env = os.environ if env is None else env
    return "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env)


def model_source(text: str) -> tuple[str, object]:
    """("preset", name) | ("transformers", config dict) | ("factory", "pkg.mod:fn")."""
    from ..models.gpt import PRESETS

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
        check_factory(text)
        return "factory", text
    raise Refused(f"--model {text!r} is not a preset ({', '.join(PRESETS)}), a config .json file, "
                  "or 'package.module:function'")


def check_factory(text: str) -> None:
    """Import ``module:function`` now, from the current directory too (as ``python -m`` would: the
    ``tunekit`` script's own folder is what Python puts first); refused with the path searched."""
    import importlib

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the ranks of a distributed run inherit sys.path
    module, name = text.split(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as e:
        missing = getattr(e, "name", None)
        if isinstance(e, ModuleNotFoundError) and missing and (module + ".").startswith(missing + "."):
            raise Refused(f"--model {text}: no module {missing!r} on sys.path ({os.pathsep.join(sys.path)}); "
                          "run from the folder that holds it or add that folder to PYTHONPATH") from None
        raise Refused(f"--model {text}: importing {module!r} failed ({type(e).__name__}: {e})") from None
    except AttributeError:
        raise Refused(f"--model {text}: module {module!r} has no {name!r}") from None
    if not callable(fn):
        raise Refused(f"--model {text}: {name!r} in {module!r} is not callable")


def layout(args, env=None) -> tuple[int, int, dict | None]:
    """(nproc, nodes, link) after checking them against --parallel and torchrun's environment."""
    env = os.environ if env is None else env
    link = None
    if args.link_bandwidth is not None or args.link_latency is not None:
        from ..engine.dist.netns import parse_bandwidth, parse_latency

        try:
            link = {"bandwidth": args.link_bandwidth or "50mbit", "latency": args.link_latency or "1ms"}
            parse_bandwidth(link["bandwidth"]), parse_latency(link["latency"])
        except ValueError as e:
            raise Refused(f"--link-{str(e).split()[0]}: {e}") from None
    if under_torchrun(env):
        if args.parallel == "none":
            raise Refused("torchrun started this process as one rank of a job: say how to split the "
                          f"model with --parallel {{{','.join(PARALLEL[1:])}}}")
        if link is not None:
            raise Refused("--link-* emulate nodes on one machine; under torchrun the nodes are real")
        world = int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_WORLD_SIZE", world))
        job = (local, world // local)
        for name, given, actual in (("nproc", args.nproc, job[0]), ("nodes", args.nodes, job[1])):
            if given is not None and given != actual:
                raise Refused(f"--{name} {given} does not match the torchrun job ({actual})")
        nproc, nodes = job
    else:
        nproc = 1 if args.nproc is None else args.nproc
        nodes = 1 if args.nodes is None else args.nodes
    for name, v in (("nproc", nproc), ("nodes", nodes)):
        if v < 1:
            raise Refused(f"--{name} must be >= 1, got {v}")
    if args.parallel == "none" and (nproc > 1 or nodes > 1 or link):
        raise Refused("--nproc, --nodes and --link-* split a run over processes: give --parallel too")
    if args.parallel == "hsdp" and nodes < 2:
        raise Refused("--parallel hsdp shards within a node and replicates across nodes: it needs --nodes >= 2")
    if link is not None and nodes < 2:
        raise Refused("--link-* join nodes: they need --nodes >= 2")
    if link is not None:
        from ..engine.dist import netns

        why = netns.check()
        if why:
            raise Refused(f"--link-* cannot emulate nodes here: {why}")
    return nproc, nodes, link


def changed_toggles(args) -> dict:
    """The toggles given on the command line that differ from Toggles' defaults."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(tg.Toggles)
            if getattr(args, f.name) != f.default}


def check(args, env=None) -> tuple:
    """Everything that can be checked before a model exists; raises Refused."""
    for name, low in (("steps", 1), ("warmup", 0)):
        if getattr(args, name) < low:
            raise Refused(f"--{name} must be >= {low}, got {getattr(args, name)}")
    source = model_source(args.model)
    nproc, nodes, link = layout(args, env)
    import torch

    t = tg.Toggles().replace(**{f.name: getattr(args, f.name) for f in dataclasses.fields(tg.Toggles)})
    problems = tg.problems(t, tg.Env(device_type="cuda" if torch.cuda.is_available() else "cpu"))
    if problems:
        raise Refused(" ".join(problems))
    from ..core.runlog import check_writable

    env = os.environ if env is None else env
    if not under_torchrun(env) or env.get("RANK") == "0":   # under torchrun only global rank 0 writes
        try:
            check_writable(args.log)
            Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise Refused(str(e)) from None
    return source, nproc, nodes, link


# --- the spec a torchrun rank joins with (the format of tunekit.models.spec / dist.worker) --------


def model_spec(source) -> dict:
    kind, value = source
    if kind == "preset":
        from ..models.gpt import GPTConfig

        return {"kind": "gpt", "config": dataclasses.asdict(GPTConfig.preset(value))}
    if kind == "transformers":
        return {"kind": "transformers", "model_type": value["model_type"], "config": value}
    return {"kind": "factory", "factory": value, "kwargs": {}}


def build_spec(args, source, nproc: int, nodes: int) -> dict:
    """What every rank of a torchrun job builds and trains: the same dict the Lab sends its workers."""
    return {"model": model_spec(source), "parallel": args.parallel, "toggles": changed_toggles(args),
            "steps": args.steps, "warmup": args.warmup, "seed": 0, "data": "corpus",
            "nproc": nproc, "nodes": nodes}


def build_model(source):
    """The model for an in-process Lab (None: the Lab builds the preset itself)."""
    kind, value = source
    if kind == "preset":
        return None
    if kind == "transformers":
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = {k: v for k, v in value.items() if k != "model_type"}
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(value["model_type"], **cfg))
    import importlib

    module, name = value.split(":")
    return getattr(importlib.import_module(module), name)()


# --- display ------------------------------------------------------------------------------------


def summary_lines(r) -> list[str]:
    """A RunResult as a few readable lines (the formats of the dashboard and the report)."""
    cond = getattr(r, "conditions", None)
    busy = cond is not None and cond.busy
    head = f"run #{r.run_id} {r.label} · {r.model} · {r.device}" + (" · ⚠ BUSY MACHINE" if busy else "")
    if r.status != "ok":
        return [head, f"  FAILED: {r.error}"]
    rows = [("speed", f"{formatted(r.tokens_per_s, FORMATS['tokens/s'])} tokens/s · step {fmt_seconds(r.step_s)} "
                      f"(min {fmt_seconds(r.step_s_min)}, max {fmt_seconds(r.step_s_max)}) over {r.steps} steps"),
            ("compute", f"{mark(formatted(r.tflops, FORMATS['TFLOPS']) + ' TFLOPS', r.hfu, r.above_peak)} · "
                        f"{mark('MFU ' + fmt_pct(r.mfu), r.mfu, r.above_peak)} · "
                        f"{mark('HFU ' + fmt_pct(r.hfu), r.hfu, r.above_peak)} of "
                        f"{formatted(r.peak_tflops, '{:.4g}')} TFLOPS [{r.peak_tflops_source}]"
                        + (f" · {WORDS}: {r.above_peak}" if r.above_peak else "")),
            ("memory", f"peak {fmt_bytes(r.peak_mem_bytes)} ({r.peak_mem_source}) · params {fmt_bytes(r.params_bytes)}"
                       f" · grads {fmt_bytes(r.grads_bytes)} · optimizer {fmt_bytes(r.optimizer_bytes)}"),
            ("loss", f"{formatted(r.loss_first, FORMATS['loss'])} -> {formatted(r.loss, FORMATS['loss'])}")]
    if cond is not None:
        rows.append(("machine", f"{cond}" + (": these figures measure the other work too, not the "
                                             "configuration; re-run when it is quiet" if busy else "")))
    world = getattr(r, "world_size", None)   # distributed runs only
    if world:
        rows.append(("layout", f"{r.parallel} · {world} ranks over {r.nodes} node(s)"))
    rows += [("note", n) for n in r.notes]
    return [head] + [f"  {k:<8} {v}" for k, v in rows]


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\rstep {done}/{total}" + ("\n" if done == total else ""))
        sys.stderr.flush()


# --- main -------------------------------------------------------------------------------------


def _refuse(message: str) -> int:
    print(f"tunekit run: error: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command != "run":
        parser().print_help()
        return 2
    try:
        source, nproc, nodes, link = check(args)
    except Refused as e:
        return _refuse(str(e))
    from ..core.runlog import RunLog
    from ..core.toggles import ToggleError

    try:
        if under_torchrun():
            from ..engine.dist.worker import join

            result = join(build_spec(args, source, nproc, nodes))
            if result is None:      # not global rank 0: rank 0 speaks for the job
                return 0
            result = RunLog(args.log).add(result)
        else:
            from ..engine.lab import Lab

            distributed = args.parallel != "none"
            # a factory goes to a distributed Lab as its "package.module:function" string, so that
            # every rank imports and calls it; in one process the model is built here
            model = source[1] if source[0] == "factory" and distributed else build_model(source)
            lab = Lab(model, preset=source[1] if source[0] == "preset" else "cpu-tiny", log_path=args.log)
            kw = dict(steps=args.steps, warmup=args.warmup, progress=_progress, **changed_toggles(args))
            if distributed:
                kw.update(parallel=args.parallel, nproc=nproc, nodes=nodes, link=link)
            result = lab.run(**kw)
    except ToggleError as e:
        return _refuse(str(e))
    except KeyboardInterrupt:
        print("tunekit run: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - any failure of the run: one line, exit 1
        r = getattr(e, "result", None)
        lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()] or [""]
        # one line: the message's first, and its last when a traceback follows (the rank's error)
        why = lines[0] + (f" ... {lines[-1]}" if len(lines) > 1 else "")
        print(f"tunekit run: failed: {type(e).__name__}: {why}", file=sys.stderr)
        if r is not None:
            print("\n".join(summary_lines(r)))
        return 1
    print("\n".join(summary_lines(result)))
    from .report_html import runs_report

    report = runs_report(RunLog.load(args.log), args.report, title=f"tunekit runs: {Path(args.log).name}")
    print(f"log: {args.log} (run #{result.run_id}) · report: {report}")
    return 1 if result.status != "ok" else 0


if __name__ == "__main__":
    sys.exit(main())
