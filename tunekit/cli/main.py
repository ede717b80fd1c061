"""The ``tunekit`` command: train a model under the Lab's toggles from a shell.

    tunekit run --precision bf16 --micro-batch 16 --steps 20          # one process, here
    tunekit run --parallel fsdp --nproc 2                              # 2 ranks on this machine
    tunekit run --parallel hsdp --nproc 2 --nodes 2 --link-bandwidth 50mbit   # emulated nodes
    tunekit run --slurm gpu --gpus-per-node 8 --nodes 2 --parallel fsdp       # a job on a Slurm cluster
    torchrun --nnodes 2 --nproc-per-node 4 ... -m tunekit run --parallel hsdp --log-path runs.jsonl
    tunekit diff runs.jsonl#0 runs.jsonl#1                            # what changed between two runs

Every run is appended to a JSONL log (``--log``) and the log's runs are drawn in a self-contained
HTML report (``--report``). The options of ``tunekit run`` are made from the declaration of
``tunekit.core.toggles.Toggles`` (type, default, help, choices), so a new toggle appears by itself.
Bad options end with one line on stderr and exit code 2 before any work; a run that fails exits 1.
Parse, call, display: the Lab and the distributed engine measure, this module only prints.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from tunekit.cli.model import Refused, model_source, search_said
from tunekit.cli.options import LOG, REPORT, add_options, resolved, stray
from tunekit.cli.parsing import Formatter as _Formatter
from tunekit.cli.parsing import Parser as _Parser
from tunekit.core import comm
from tunekit.core import toggles as tg
from tunekit.core.run_text import summary_lines  # one builder: print(r) shows the same lines

PARALLEL = ("none", *comm.PARALLEL)  # the distributed engine's kinds, plus "none" (one process)
STEPS, WARMUP = 20, 2            # as lab.run
FACTORY_INPUTS = ("tunekit run gives a factory's model the Lab's byte-token batches (x, y: micro-batch x seq-len "
                  "int64) and takes the loss from model(x, y); a model that takes other inputs runs from Python: "
                  "tunekit.Lab(model, batch_fn, loss_fn) (the docs: Your own model)")


def run_parser() -> argparse.ArgumentParser:
    from tunekit.models.gpt_config import PRESETS

    p = _Parser(prog="tunekit run", formatter_class=_Formatter,
                description="Train a model for --steps timed steps under the given toggles; print "
                            "what was measured, append it to --log and redraw --report.")
    p.add_argument("--steps", type=int, default=STEPS, help="timed steps")
    p.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps first")
    p.add_argument("--model", default="cpu-tiny",
                   help=f"a GPT preset ({', '.join(PRESETS)}), a transformers config JSON file, or "
                        "'package.module:function' returning the model")
    add_options(p, tg.Toggles, "toggles (tunekit.core.setting.Toggles)")
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
    c = p.add_argument_group("cluster (Slurm: the run as a job, its ranks under srun; tunekit.Slurm)")
    c.add_argument("--slurm", metavar="PARTITION", default=None,
                   help="submit the run to this partition ('default': the cluster's); --nodes nodes, "
                        "--nproc ranks per node (CPU) or --gpus-per-node")
    c.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node, one rank each")
    c.add_argument("--time", default="00:30:00", help="the job's time limit, in Slurm's words")
    c.add_argument("--account", default=None, help="Slurm account")
    c.add_argument("--qos", default=None, help="Slurm quality of service")
    o = p.add_argument_group("output")
    o.add_argument("--trace", action="store_true",
                   help="one more step under torch.profiler after the timed ones, set against the run's "
                        "plan: its `traced` line says how far from the expected step and where (one process)")
    # --log-path too: torchrun's own parser stops at --log (a prefix of its --log-dir and --logs-specs)
    o.add_argument("--log", "--log-path", dest="log", default=LOG,
                   help="JSONL run log, appended to (under torchrun write --log-path)")
    o.add_argument("--report", default=REPORT, help="HTML report of every run in the log (self-contained)")
    o.add_argument("--baseline", type=int, default=None, metavar="N", help="run id the report compares every "
                   "run with; None: the newest run with every toggle at its default")
    return p


def version_line() -> str:
    """``tunekit 0.1.0 (torch 2.x, Python 3.11.7)``: what a bug report needs, without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    from tunekit import __version__

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    return f"tunekit {__version__} (torch {torch_version}, Python {sys.version.split()[0]})"


def parser() -> argparse.ArgumentParser:
    """The ``tunekit`` command: its help lists the commands, one line each; ``tunekit COMMAND
    --help`` gives a command's options (run's: every toggle with its default)."""
    run = run_parser()
    p = _Parser(prog="tunekit", formatter_class=_Formatter,
                description="tunekit from a shell: train and measure, plan, compare runs, check the machine.",
                epilog="`tunekit COMMAND --help` lists a command's options with their defaults.")
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", title="commands", metavar="COMMAND", parser_class=_Parser)
    sub.add_parser("run", parents=[run], add_help=False, formatter_class=_Formatter,
                   description=run.description, help="train and measure one configuration")
    from tunekit.cli.plan import plan_parser

    planned = plan_parser(_Parser, _Formatter)
    sub.add_parser("plan", parents=[planned], add_help=False, formatter_class=_Formatter,
                   description=planned.description, help="plan a step on a device without running it")
    from tunekit.cli.diff import diff_parser

    diffed = diff_parser(_Parser, _Formatter)
    sub.add_parser("diff", parents=[diffed], add_help=False, formatter_class=_Formatter,
                   description=diffed.description, help="what changed between two saved runs")
    from tunekit.cli.doctor import doctor_parser

    doc = doctor_parser(_Parser, _Formatter)
    sub.add_parser("doctor", parents=[doc], add_help=True, formatter_class=_Formatter,
                   description=doc.description, help="check this machine for tunekit (OK/WARN/FAIL lines)")
    return p


# --- checks: all before any work --------------------------------------------------------------


def under_torchrun(env=None) -> bool:
    """Whether torchrun (or the elastic agent) started this process as one rank of a job."""
    env = os.environ if env is None else env
    return "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env)


def layout(args, env=None) -> tuple[int, int, dict | None]:
    """(nproc, nodes, link) after checking them against --parallel and torchrun's environment."""
    env = os.environ if env is None else env
    link = None
    if args.link_bandwidth is not None or args.link_latency is not None:
        from tunekit.parallel.netns import parse_bandwidth, parse_latency

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
        from tunekit.parallel import netns

        why = netns.check()
        if why:
            raise Refused(f"--link-* cannot emulate nodes here: {why}")
    return nproc, nodes, link


def with_rules(args):
    """``args`` with each toggle left at a rule of the device (`cli.options.DeviceRule`: the
    precision) given the rule's value on this machine's default device (`here`)."""
    for t in tg.declared(tg.Toggles):
        if t.device_default:
            setattr(args, t.name, resolved(getattr(args, t.name), t.device_default, *here()))
    return args


def changed_toggles(args) -> dict:
    """The toggles given on the command line (the device's precision: `with_rules`) that differ
    from Toggles' defaults."""
    with_rules(args)
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(tg.Toggles)
            if getattr(args, f.name) != f.default}


def check(args, env=None) -> tuple:
    """Everything that can be checked before a model exists; raises Refused."""
    for name, low in (("steps", 1), ("warmup", 0)):
        if getattr(args, name) < low:
            raise Refused(f"--{name} must be >= {low}, got {getattr(args, name)}")
    if why := stray(args, run_parser(), "slurm", ("gpus_per_node", "time", "account", "qos")):
        raise Refused(why)
    source = model_source(args.model)
    nproc, nodes, link = layout(args, env)
    if getattr(args, "slurm", None) is not None:
        if link is not None or under_torchrun(env) or args.trace:
            raise Refused("--slurm submits the run to a cluster: not with --link-*, --trace or under torchrun")
        try:
            slurm_target(args, nproc, nodes)
        except ValueError as e:
            raise Refused(f"--slurm: {e}") from None
    if getattr(args, "trace", False) and (args.parallel != "none" or nproc * nodes > 1 or under_torchrun(env)):
        raise Refused("--trace traces one process's step: not with --parallel, --nproc/--nodes or under "
                      "torchrun (trace a one-process run of the same toggles instead)")
    from tunekit.measure.device import default_device

    with_rules(args)
    t = tg.Toggles().replace(**{f.name: getattr(args, f.name) for f in dataclasses.fields(tg.Toggles)})
    problems = tg.problems(t, tg.Env(device_type=default_device().type))
    if problems:
        raise Refused(" ".join(problems))
    from tunekit.lab.runlog import check_writable

    env = os.environ if env is None else env
    if not under_torchrun(env) or env.get("RANK") == "0":   # under torchrun only global rank 0 writes
        try:
            check_writable(args.log)
            Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise Refused(str(e)) from None
    return source, nproc, nodes, link


def here() -> tuple[str, bool | None]:
    """This machine's default device type and whether it trains in bf16 (CUDA: torch says; a
    CPU's fast bf16 is not detected): what a rule of the device is given (`core.setting.best_precision`)."""
    import torch

    from tunekit.measure.device import default_device

    device = default_device()
    return device.type, (torch.cuda.is_bf16_supported() if device.type == "cuda" else None)


# --- the spec a torchrun rank joins with (tunekit.models.spec, as dist.worker reads it) --------


def build_spec(args, source, nproc: int, nodes: int) -> dict:
    """What every rank of a torchrun job builds and trains: the same dict the Lab sends its workers."""
    from tunekit.models.spec import source_spec

    return {"model": source_spec(*source), "parallel": args.parallel, "toggles": changed_toggles(args),
            "steps": args.steps, "warmup": args.warmup, "seed": 0, "data": "corpus",
            "nproc": nproc, "nodes": nodes}


def lab_model(source, distributed: bool):
    """The model an in-process Lab is given: None for a preset (the Lab builds it), a factory's
    name for a distributed run (every rank imports and calls it), else the model built here (a
    factory's result unchecked: the Lab refuses what is no model)."""
    from tunekit.models.spec import build_model, call_factory, source_spec

    kind, value = source
    if kind == "preset":
        return None
    if kind == "factory":
        return value if distributed else call_factory(value)
    return build_model(source_spec(kind, value))


# --- display ------------------------------------------------------------------------------------


def slurm_target(args, nproc: int, nodes: int):
    """``--slurm PARTITION`` and its options as a tunekit.Slurm (a ValueError: refused)."""
    from tunekit.parallel.slurm import Slurm

    return Slurm(partition=None if args.slurm == "default" else args.slurm, nodes=nodes,
                 gpus_per_node=args.gpus_per_node, ntasks_per_node=None if args.gpus_per_node else nproc,
                 time=args.time, account=args.account, qos=args.qos)


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
    if args.command == "plan":
        from tunekit.cli.plan import plan_main

        return plan_main(args)
    if args.command == "diff":
        from tunekit.cli.diff import diff_main

        return diff_main(args)
    if args.command == "doctor":
        from tunekit.cli.doctor import doctor_main

        return doctor_main(args)
    if args.command != "run":
        parser().print_help()
        return 2
    try:
        source, nproc, nodes, link = check(args)
    except Refused as e:
        return _refuse(str(e))
    from tunekit.core.toggles import ToggleError
    from tunekit.lab.runlog import RunLog

    try:
        if under_torchrun():
            from tunekit.parallel.worker import join

            result = join(build_spec(args, source, nproc, nodes))
            if result is None:      # not global rank 0: rank 0 speaks for the job
                return 0
            result = RunLog(args.log).add(result)
        else:
            from tunekit.view.progress import wait_progress

            distributed = args.parallel != "none"
            with wait_progress("tunekit run: setting up", True) as shown:   # seconds before the first step
                shown.at("importing torch")
                from tunekit.lab.lab import Lab

                shown.at("building the model and checking one step of it")
                model = lab_model(source, distributed)
                try:
                    lab = Lab(model, preset=source[1] if source[0] == "preset" else "cpu-tiny", log_path=args.log)
                except (ValueError, TypeError) as e:   # its batch_fn/loss_fn advice: no option of this command
                    raise (type(e)(f"{e}; {FACTORY_INPUTS}") if source[0] == "factory" else e) from e
            kw = dict(steps=args.steps, warmup=args.warmup, progress=_progress, verbose=False,
                      **changed_toggles(args), **({"trace": True} if args.trace else {}))
            if distributed:
                kw.update(parallel=args.parallel, nproc=nproc, nodes=nodes, link=link)
            if args.slurm is not None:
                kw.pop("nproc", None), kw.pop("nodes", None), kw.pop("link", None)
                kw["on"] = slurm_target(args, nproc, nodes)
            result = lab.run(**kw)
    except ToggleError as e:
        return _refuse(search_said(e, source))
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
    from tunekit.cli.report_html import runs_report

    runs, title = RunLog.load(args.log), f"tunekit runs: {Path(args.log).name}"
    try:
        report = runs_report(runs, args.report, title=title, baseline=args.baseline)
    except ValueError as e:  # --baseline names no run of the log: said, and the default used
        print(f"tunekit run: --baseline: {e}; the report compares with the default baseline", file=sys.stderr)
        report = runs_report(runs, args.report, title=title)
    print(f"log: {args.log} (run #{result.run_id}) · report: {report}")
    return 1 if result.status != "ok" else 0


if __name__ == "__main__":
    sys.exit(main())
