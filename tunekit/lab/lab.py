"""The training lab: one live model, its data and optimizer, trained under toggles you flip.

Timing: ``warmup`` steps run first and are not timed; each timed step is clocked with the device
synchronized (tunekit.measure.timing). FLOPs are counted once per configuration on a separate,
untimed forward+backward (``flops_source`` = ``counted`` then ``cached``). MFU uses the analytic
model FLOPs (6N + attention, causal), HFU the counted executed FLOPs (recomputation included).
The Lab is a façade: its training step is ``train.TrainStep`` (``lab.trainer``, the one
every distributed rank takes), a run is ``lab.run`` (one process) or ``lab.distributed``;
what it has recorded (results, compare, save/load, its repr) is ``lab.results.LabResults``.
"""

from __future__ import annotations

import torch

from tunekit.core.gpus import DEFAULT_DEVICE
from tunekit.core.refusals import user_facing
from tunekit.core.results import RunResult, results_frame
from tunekit.core.setting import Setting
from tunekit.core.toggles import Env, ToggleError, Toggles, toggle_keywords
from tunekit.core.validate import flag, keywords_checked
from tunekit.lab import run as single
from tunekit.lab import searches
from tunekit.lab.build import build
from tunekit.lab.build import env as build_env
from tunekit.lab.build import memory_target as build_target
from tunekit.lab.cluster import submitted
from tunekit.lab.distributed import run_distributed
from tunekit.lab.expect_line import stop_expecting
from tunekit.lab.expect_peak import stepped
from tunekit.lab.plan import lab_plan, show_plan_keywords
from tunekit.lab.results import LabResults
from tunekit.lab.setting import LAB_CHOICES, check, resolve, setting_of
from tunekit.models.gpt import GPTConfig
from tunekit.train.guard import NonFiniteRunError
from tunekit.train.record import Steps

__all__ = ["Lab", "RunResult", "results_frame", "NonFiniteRunError"]


def _trainer_attribute(name: str, doc: str) -> property:
    """A Lab attribute kept by its TrainStep (``lab.batch_fn = f`` changes what the steps draw)."""
    return property(lambda self: getattr(self.trainer, name),
                    lambda self, value: setattr(self.trainer, name, value), doc=doc)


class Lab(LabResults):
    """A live model + data + optimizer kept across runs.

    Example: ``lab = Lab(); base = lab.run(steps=20); lab.run(precision="bf16"); lab.results()``.

    ``model``: None (a fresh ``GPT(config or preset)``), ``"package.module:function"`` (a
    factory called with no arguments; distributed runs rebuild the model with it), a
    transformers causal LM (e.g.
    ``AutoModelForCausalLM.from_config(cfg)``: batches, loss, checkpointing and attention work
    as for the built-in GPT), or any ``nn.Module`` with ``batch_fn(micro_batch, seq_len) -> (x, y)``,
    ``loss_fn(model, x, y) -> loss`` and, for checkpointing, ``blocks`` (an attribute path such
    as ``"layers"`` or a list of modules). Keyword ``defaults`` (e.g. ``micro_batch=16``) set the
    toggles every run starts from. Runs are appended to ``log_path`` (its earlier runs resumed),
    else to the day's log ``core.paths.runs_dir()/lab-YYYY-MM-DD.jsonl`` that Labs share.

    Every argument is checked here, before any training: a model class instead of an instance, a
    device this machine lacks, defaults no run could use, and, by one forward of two samples under
    no_grad (``batch_fn`` is called once for it; weights, buffers and RNG states are left as they
    were), a batch the loss cannot take or a loss that is not one number.
    """

    @user_facing   # a refusal: the user's line and the message (core.refusals)
    @keywords_checked(LAB_CHOICES)
    @toggle_keywords
    def __init__(self, model=None, batch_fn=None, loss_fn=None, *, preset: str = "cpu-tiny",
                 config: GPTConfig | None = None, data="corpus", device=None, log_path=None,
                 peak_tflops: float | None = None, seed: int = 0, blocks=None, **defaults):
        # every argument is checked before anything is built, moved or trained (lab.build)
        build(self, model, batch_fn, loss_fn, preset, config, data, device, log_path, peak_tflops, seed, blocks,
              defaults)

    model = _trainer_attribute("model", "The live nn.Module.")
    adapter = _trainer_attribute("adapter", "How tunekit drives the model (models.adapters).")
    optimizer = _trainer_attribute("optimizer", "The live optimizer (None before the first run; set "
                                                "to None, the next apply builds a fresh one).")
    batch_fn = _trainer_attribute("batch_fn", "(micro_batch, seq_len) -> (x, y): the batches the steps draw.")
    loss_fn = _trainer_attribute("loss_fn", "(model, x, y) -> loss: the loss the steps take.")

    @property
    def optimizer_name(self) -> str | None:
        """The registry name of the live optimizer (None before the first run)."""
        return self.trainer.optimizer_name

    # --- data -------------------------------------------------------------------------------

    def batch(self, micro_batch: int, seq_len: int):
        """(x, y) for one micro-batch, on the lab's device. Example: ``x, y = lab.batch(4, 128)``."""
        return self.batch_fn(micro_batch, seq_len)

    # --- toggles ----------------------------------------------------------------------------

    def env(self) -> Env:
        """What this machine and model allow (used to explain refused toggles).
        Example: ``lab.env().bf16_supported``."""
        return build_env(self)

    @toggle_keywords
    def resolve(self, **changes) -> Toggles:
        """The full toggles a run with ``changes`` would use (defaults filled in).
        Example: ``lab.resolve(precision="bf16").seq_len``."""
        return resolve(self, changes)

    @toggle_keywords
    def setting_of(self, setting: Setting | None = None, **changes) -> Setting:
        """The one `tunekit.Setting` of a call with ``setting`` or toggle keywords, as every entry point
        makes it at its edge (tunekit.lab.setting.setting_of). Example: ``lab.setting_of(precision="bf16")``."""
        return setting_of(self, setting, changes, api="lab.setting_of")

    def model_state(self, t: Toggles) -> Toggles:
        """``t`` with the attention and checkpointing it leaves None taken from the model's own
        state (`TrainStep.own`): as it was given to the Lab, or as last changed by hand
        (``model.gradient_checkpointing_enable()``, ``model.set_attn_implementation("eager")``);
        the run uses and records them.
        Example: ``lab.model_state(lab.defaults).checkpointing`` (what a run leaving it out takes)."""
        return self.trainer.own(t)

    def check(self, t: Toggles, steps: int = 1, warmup: int = 0) -> list[str]:
        """Why ``t`` cannot run here (empty list: it can). Example: ``lab.check(lab.resolve(precision="fp16"))``."""
        return check(self, t, steps, warmup)

    # --- the live model: toggles, one step, clean-up (train.TrainStep) ----------------

    def apply(self, t: Toggles, notes: list | None = None) -> list:
        """Put ``t`` on the live model and optimizer (attention, checkpointing, optimizer, lr,
        compile); returns ``notes`` with what changed beyond the toggles themselves.
        Example: ``lab.apply(lab.resolve(checkpointing=True))``."""
        return self.trainer.apply(t, notes)

    def train_step(self, t: Toggles):
        """One optimizer step under ``t`` (``apply(t)`` first): ``grad_accum`` micro-batches of
        forward and backward, then the optimizer. Returns the summed loss (a tensor).
        Example: ``t = lab.resolve(); lab.apply(t); loss = lab.train_step(t)``."""
        stepped(self, t)   # what this process ran: lab.expect's peak adds the kernels it has not (expect_peak)
        return self.trainer.step(t)

    def grad_scaler(self, t: Toggles):
        """The GradScaler for an fp16 run (None otherwise), kept as long as the optimizer.
        Example: ``lab.grad_scaler(lab.resolve(precision="fp16"))``."""
        return self.trainer.grad_scaler(t)

    def recover(self) -> None:
        """After a failed or interrupted step: no half-made gradients, no GradScaler mid-step.
        Example: ``lab.recover()`` after a step of your own raised."""
        self.trainer.recover()

    @property
    def cuda_index(self) -> int | None:
        """The CUDA index of the lab's device (None off CUDA)."""
        on = self.device.type == "cuda"
        return None if not on else self.device.index if self.device.index is not None else torch.cuda.current_device()

    def memory_target(self, micro_batch: int | None = None, seq_len: int | None = None, batch=None):
        """What ``measure_memory(lab)`` measures (a measure.memory.StepTarget): the live model and
        loss under the default toggles, on ``batch`` or one of the Lab's batches.
        Example: ``tunekit.measure_memory(lab)`` calls it."""
        return build_target(self, micro_batch, seq_len, batch)

    # --- the run (lab.run, lab.distributed) --------------------------------------------

    @user_facing
    @keywords_checked()   # a misspelled keyword: the one meant (steps=, checkpointing=)
    @toggle_keywords
    def run(self, steps: int = 20, warmup: int = 2, progress=None, guard: bool = True,
            trace: bool = False, memory: bool = False, parallel: str | None = None, nproc: int = 1,
            nodes: int = 1, link=None, verbose: bool = True, setting=None, on=None, wait=True, **changes):
        """Apply ``changes`` (toggles) to the live model and train ``steps`` timed steps.
        Example: ``lab.run(steps=20, precision="bf16", micro_batch=16)``. ``progress(done, total)``
        is called when the clock starts (done=0) and after each timed step; ``verbose`` (default)
        shows the steps and one line at the end (tunekit.view.progress), ``verbose=False`` nothing.
        Refused combinations raise ``ToggleError`` (a ValueError; ``problems`` say why) before any
        work, as does a step whose estimated peak memory exceeds the memory available
        (``WontFitError``; tunekit.lab.fit). A NaN/inf loss or weight stops the run: it is
        recorded as failed, undone with ``guard`` (weights, optimizer, scaler), and
        ``NonFiniteRunError`` raised. An out-of-memory error leaves no gradients, frees the memory,
        undoes the run (with ``guard``) and says what to try. ``trace``/``memory``: one extra
        step after the timed ones under torch.profiler (``result.trace``, ``result.memory``).
        ``parallel="ddp" | "fsdp" | "fsdp_grad_op" | "hsdp"`` runs ``nodes`` x ``nproc`` worker
        processes instead (tunekit.parallel: gloo on CPU, NCCL on CUDA), each rebuilding this
        model with the Lab's current weights and training its slice of the global batch
        (``micro_batch`` per rank); ``link={"bandwidth": "50mbit", "latency": "1ms"}`` puts each
        node in its own network namespace. The Lab's own model is not changed by such a run.
        Ctrl-C stops a run in its steps; while it sets up, records or cleans up it waits. An
        interrupted run is not recorded, is undone (with ``guard``), and its tensors are freed.
        ``setting``: a ``tunekit.Setting`` for the toggles and layout (``setting=Setting(parallel="ddp")``).
        ``on=tunekit.Slurm(...)``: a cluster job instead (tunekit.lab.cluster; ``result.job``); with
        ``wait=False`` a handle at once, ``.result()`` later (tunekit.lab.cluster_run.ClusterRun)."""
        if on is None and wait is not True:
            raise ToggleError(["wait=False is for a cluster run (on=tunekit.Slurm(...)): a run here waits"])
        ranks = (1, 1) if on is not None and setting is None else (nproc, nodes)   # a job's: its target's
        s = setting_of(self, setting, changes, (parallel, *ranks), steps=steps, warmup=warmup)
        if on is not None:   # a cluster job (tunekit.lab.cluster) of the same Setting; its ranks the target's
            ranks = (nproc, nodes) if setting is None else (s.world_size // s.nodes, s.nodes)
            return submitted(self, on, steps, warmup, progress, s, verbose, (trace, memory, link, *ranks), wait)
        if not flag("verbose", verbose):
            return self._run(steps, warmup, progress, guard, trace, memory, link, s)
        from tunekit.view.progress import RunProgress  # the view that shows it; chosen per frontend there
        with RunProgress(steps, progress) as shown:
            shown.result = self._run(steps, warmup, shown.tick, guard, trace, memory, link, s)
        return shown.result

    def _run(self, steps, warmup, progress, guard, trace, memory, link, s: Setting):
        """``run`` without its display: one process (lab.run) or ranks (lab.distributed)."""
        if s.parallel is not None or s.world_size != 1 or link is not None:
            if trace or memory:
                raise ToggleError(["trace/memory trace one process's step: not available with parallel=... "
                                   "(trace a single-process run of the same toggles instead)."])
            stop_expecting(self)   # the ranks' steps are timed: no fake step planned beside them
            return run_distributed(self, steps, warmup, progress, s, link)
        return single.run(self, steps, warmup, progress, guard, trace, memory, s)

    def measure_steps(self, t: Toggles, steps: int, progress=None) -> Steps:
        """``steps`` timed training steps under ``t`` (applied already); see ``lab.run``.
        Example: ``t = lab.resolve(); lab.apply(t); lab.measure_steps(t, 5).times``."""
        return single.measure_steps(self, t, steps, progress)

    def traced_step(self, t: Toggles, step_s: float, trace: bool = True, memory: bool = False):
        """One more training step under torch.profiler; see ``lab.run``.
        Example: ``breakdown, timeline = lab.traced_step(t, step_s=0.1, memory=True)``."""
        return single.traced_step(self, t, step_s, trace, memory)

    @user_facing
    @keywords_checked()
    @toggle_keywords
    def find_max_batch_size(self, start: int = 1, limit: int = 1024, memory_budget_bytes=None,
                            budget_fraction: float = 0.5, progress=None, snapshot_on_oom: bool = True,
                            budget_s: float | None = 60.0, verbose: bool = True, setting=None, **changes):
        """Largest micro-batch that fits in ``[start, limit]`` for the current toggles plus ``changes``,
        searched for at most ``budget_s`` wall-clock seconds (default 60; None: no limit). Returns a
        ``MaxBatchResult``: ``best``, ``stopped`` ("converged", "search limit" or "budget") and its
        ``verdict`` in words. The arguments are ``tunekit.lab.maxbatch.find_max_batch_size``'s;
        ``verbose`` (default) shows the trial going and the verdict at the end (tunekit.view.progress),
        ``verbose=False`` nothing; ``setting``: a ``tunekit.Setting`` instead of the toggles (the
        search tries its own micro-batches). Example: ``found = lab.find_max_batch_size(limit=256, budget_s=30)``."""
        s = setting_of(self, setting, changes, one_process=True, api="find_max_batch_size")
        return searches.find_max_batch(self, start, limit, memory_budget_bytes, budget_fraction, progress,
                                       snapshot_on_oom, budget_s, verbose, s)

    @user_facing
    @show_plan_keywords
    def plan(self, device: str = DEFAULT_DEVICE, **overrides):
        """``tunekit.plan`` of this Lab's model on ``device`` (a GPU row's name or "cpu"): memory,
        whether it fits and the speed-of-light bound of one step under the toggles a run would
        start from (``lab.resolve()``), without running it. ``overrides`` are plan's keywords
        (precision, weights, micro_batch, seq_len, checkpointing, optimizer, search, ...) and the
        Lab's other toggles, as ``lab.run`` takes them; a toggle the plan does not model (compile,
        an attention it cannot switch to) is said in ``plan.notes``. The plan builds its own model
        under fake tensors (a model of your own: its fake twin, on the Lab's batch_fn, loss_fn and
        blocks): the live model, its weights and optimizer stay as they are.
        Example: ``p = lab.plan("H100 SXM", precision="bf16", micro_batch=32); p.fits, p.bound_tokens_per_s``."""
        return lab_plan(self, device, overrides)

    @user_facing
    def explain(self, run=None):
        """The last traced run (or ``run``, a RunResult or run id) against the expected step of its
        setting on its device (``lab.plan``), group of ops by group: ``tunekit.core.explain``.
        Example: ``lab.run(trace=True); print(lab.explain().summary)``."""
        from tunekit.lab.explain import lab_explain
        return lab_explain(self, run)

    @user_facing
    @keywords_checked()
    @toggle_keywords
    def expect(self, setting=None, base=None, *, verbose: bool = True, **changes):
        """Expected step time, tokens/s, MFU and peak memory of what ``lab.run(setting=..., **changes)`` would
        run here, calibrated by the Lab's last measured run (``base``: another; tunekit.lab.expect). What
        lab.run would refuse is refused first, a size no memory here holds too (WontFitError, by lab.run's check).
        ``verbose`` (default): over 2 s (a first CPU calibration) one progress line, ``lab.expect``'s, its
        plans' stages on it (tunekit.view.progress), then how long it took; ``verbose=False`` nothing
        (the dashboard's line asks so from its thread).
        Example: ``lab.run(trace=True); print(lab.expect(checkpointing=True).line)``."""
        from tunekit.lab.expect import lab_expect
        from tunekit.view.progress import wait_progress
        with wait_progress("lab.expect", flag("verbose", verbose)):   # its two plans inside: one line
            return lab_expect(self, setting, base, verbose=verbose, **changes)

    def reset_optimizer(self) -> None:
        """Drop the optimizer and its state: the next ``apply`` or ``run`` builds a fresh one.
        Example: ``lab.reset_optimizer(); lab.run(steps=20)`` starts from empty optimizer state."""
        self.trainer.reset_optimizer()

    @user_facing
    @keywords_checked()
    @toggle_keywords
    def autotune(self, budget_s: float = 60.0, objective: str = "tokens_per_s", *, keep_global_batch=False,
                 max_micro_batch=None, steps: int = 3, warmup: int = 1, repeats: int = 3, noise: float = 0.03,
                 memory_budget_bytes=None, space: dict | None = None, keep: str = "winner",
                 compile_s: float = 60.0, trial_s: float = 0.25, progress=None, trials=None, on=None,
                 setting=None, verbose: bool = True, **changes):
        """The fastest configuration that fits, searched within ``budget_s`` seconds; returns an
        ``AutotuneResult`` (winner, evidence table, figure). The options are
        ``tunekit.autotune.autotune``'s (each explained there; `AutotuneOptions` holds them);
        it starts from the Lab's toggles plus ``changes`` (or ``setting``); ``verbose`` (default) shows the
        stage and trial going and the winner at the end (tunekit.view.progress), ``verbose=False`` nothing.
        ``on=tunekit.Slurm(...)``: each trial a cluster job (tunekit.lab.cluster.ClusterTrials).
        Example: ``found = lab.autotune(budget_s=120, keep_global_batch=True)``."""
        s = setting_of(self, setting, changes, one_process=True, api="lab.autotune")
        return searches.autotune(self, budget_s, objective, progress, verbose, dict(
            keep_global_batch=keep_global_batch, max_micro_batch=max_micro_batch, steps=steps, warmup=warmup,
            repeats=repeats, noise=noise, memory_budget_bytes=memory_budget_bytes, space=space, keep=keep,
            compile_s=compile_s, trial_s=trial_s, trials=trials, on=on, setting=s))

    def dashboard(self, on=None):
        """ipywidgets dashboard over this lab (controls, Run, Find max batch, table, charts); ``on``: a
        cluster target (or {name: target}) its "Run on" menu offers. Example: ``lab.dashboard()``."""
        from tunekit.lab.dashboard import Dashboard
        from tunekit.view.frontend import in_terminal, shell
        dash = Dashboard(self, on=on)   # its expectation line where a widget frontend draws it
        if shell() is None or in_terminal():
            # nothing will draw the widget (plain Python; a terminal IPython shows only a cell's last
            # value, and `lab.dashboard()` mid-cell is none): its text now, once, wherever it is called
            print(dash.text_fallback())
            dash.text_printed = True
        return dash
