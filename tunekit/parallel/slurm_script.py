"""The batch script of a planned setting (``Plan.sbatch``): the layout its setting needs, the
tunekit worker training the planned model or the user's own command, and the plan's expected step
as a comment. Engine (tunekit.parallel.slurm's target writes the script itself).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

from tunekit.core.fmt import fmt_ms, fmt_pct
from tunekit.core.toggles import Toggles
from tunekit.core.units import is_missing
from tunekit.core.validate import whole


def trainable_spec(model) -> dict:
    """The worker's model spec of what a plan planned: a GPT preset name, 'package.module:function',
    a transformers config (a dict with model_type, or a config object), a model instance, or a
    spec already made."""
    from tunekit.models.gpt import PRESETS
    from tunekit.models.spec import factory_spec, model_spec, source_spec

    if isinstance(model, dict) and "kind" in model:
        return model
    if isinstance(model, str):
        if model in PRESETS:
            return source_spec("preset", model)
        if model.count(":") == 1 and all(model.split(":")):
            return factory_spec(model)
        if model.endswith(".json") and Path(model).is_file():
            return source_spec("transformers", json.loads(Path(model).read_text()))
        raise ValueError(f"model={model!r} is not a preset ({', '.join(PRESETS)}), a transformers config .json "
                         "file or 'package.module:function'")
    from tunekit.models.gpt import GPTConfig

    if isinstance(model, GPTConfig):
        return {"kind": "gpt", "config": dataclasses.asdict(model)}
    if isinstance(model, dict) and "model_type" in model:
        return source_spec("transformers", model)
    if hasattr(model, "to_dict") and hasattr(model, "model_type"):
        return source_spec("transformers", model.to_dict())
    return model_spec(model)


def plan_script(target, plan, folder, model=None, script: str | None = None, option=None,
                steps: int = 20, warmup: int = 2) -> Path:
    """Write ``folder/job.sh`` (and the spec it runs) for ``plan``'s setting, or for its advice's
    ``option`` (an index into ``plan.advice`` or one of its Options): the node and GPU request the
    setting needs, srun with NUMA binding, the tunekit worker training ``model`` (default: what the
    plan planned, where it can be rebuilt) for ``steps`` timed steps, or ``script`` (your own
    command: each task gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT), and the
    plan's expected step as a comment. Returns the script's path; ``sbatch PATH`` submits it."""
    from dataclasses import fields as dc_fields

    whole("steps", steps)
    whole("warmup", warmup, 0)
    chosen = None
    if option is not None:
        chosen = plan.advice[option] if isinstance(option, int) else option
        if not hasattr(chosen, "setting"):
            raise ValueError(f"option is an index into plan.advice (0..{len(plan.advice) - 1}) or one of its "
                             f"Options, got {option!r}")
    setting = chosen.setting if chosen is not None else plan.setting
    expected = chosen.expected if chosen is not None else plan.expected
    world, nodes = setting.world_size or 1, setting.nodes or 1
    per_node = world // nodes
    gpu = plan.device.lower() not in ("cpu",)
    asked = {"nodes": target.nodes, "gpus_per_node" if gpu else "ntasks_per_node":
             target.gpus_per_node if gpu else target.ntasks_per_node}
    wanted = {"nodes": nodes, "gpus_per_node" if gpu else "ntasks_per_node": per_node}
    clash = [f"{k}={asked[k]} (the setting needs {v})" for k, v in wanted.items()
             if asked[k] not in (None, v) and not (k == "nodes" and asked[k] == 1)]
    if clash:
        raise ValueError(f"the target asks for {', '.join(clash)}: leave them out, the setting decides them")
    target = replace(target, nodes=nodes, **({"gpus_per_node": per_node} if gpu else {"ntasks_per_node": per_node}))
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    label = getattr(chosen, "label", "") or "as planned"
    comment = [f"tunekit plan: {plan.model} on {world} x {plan.device} ({nodes} node(s)), {label}"]
    if expected is not None and not is_missing(expected.step_s):
        # the figures as the plan's text rounds them (MFU to 0.1%: a small model's 0.1% is not '0%')
        comment.append(f"expected step {fmt_ms(expected.step_s)}, {expected.tokens_per_s:,.0f} tokens/s "
                       f"per {'GPU' if gpu else 'rank'}, MFU {fmt_pct(expected.mfu)} "
                       "(tunekit.plan's expectation: what a good run reaches)")
    else:
        comment.append("no expected step (a device figure is missing: see the plan's notes)")
    if script is not None:
        ranks = ("export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
                 f"LOCAL_WORLD_SIZE={per_node}; exec {script}")
        comment.append("your script: tunekit.Monitor(model, log_to=[...]) inside its loop measures each step")
        command = ["bash", "-c", ranks]
    else:
        toggle_names = {f.name for f in dc_fields(Toggles)}
        spec = {"model": trainable_spec(model if model is not None else
                                        getattr(plan, "model_spec", None) or setting.model or plan.model),
                "parallel": setting.parallel if world > 1 else None, "steps": steps, "warmup": warmup, "seed": 0,
                "toggles": {k: getattr(setting, k) for k in toggle_names}, "nproc": per_node, "nodes": nodes,
                "out_dir": str(folder), "progress_file": str(folder / "progress"), "error_dir": str(folder)}
        (folder / "spec.json").write_text(json.dumps(spec))
        command = [target.python, "-m", "tunekit.parallel.worker", str(folder / "spec.json")]
    path = folder / "job.sh"
    path.write_text(target.script(command, folder, "tunekit-plan", comment, sockets=target.sockets()))
    return path
