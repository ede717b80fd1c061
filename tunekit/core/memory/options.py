"""The options of `estimate_memory`: one dataclass whose fields are its keyword parameters, with
their defaults and checks. Pure.

    >>> MemoryOptions(micro_batch=8, tp=2).sharded     # (zero_stage, dp, notes)
    (0, 1, [])
    >>> MemoryOptions(tp=True)          # ValueError: tp must be a positive integer, got True
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, fields

from tunekit.core import validate
from tunekit.core.setting import from_keywords, memory_layout
from tunekit.core.specs import device_type, find_spec

ACTIVATION_MODES = ("auto", "gpt", "hf", "korthikanti")
# the CUDA context and the kernels torch loads, outside its allocator: the one figure an estimate
# and a plan charge (0.92 GiB with CUDA_MODULE_LOADING=EAGER in the same source, 1.78 with torch 1.10)
CUDA_CONTEXT = (0.47 * 2**30, ("CUDA context, lazy loading (torch 2.1 on an A100: stas00/ml-engineering "
                               "training/performance/README.md, Preloaded CUDA kernels memory usage)"))


@dataclass(frozen=True)
class MemoryOptions:
    """How the estimated run trains: precision, optimizer, batch, parallelism, and sizes given
    by hand (each None is read from the model's config). Checked when made (ValueError)."""

    n_params: float | None = None          # parameter count (default: counted or read from the config)
    precision: str | None = None           # the training precision, as the Lab's (core.setting)
    optimizer: str = "adamw"
    micro_batch: int = 1
    seq_len: int | None = None
    checkpointing: bool = False
    tp: int = 1                             # tensor-parallel ranks
    pp: int = 1                             # pipeline stages
    zero_stage: int = 0                     # 0-3: what data parallelism shards
    dp: int = 1                             # data-parallel ranks
    n_layer: int | None = None
    n_embd: int | None = None
    n_head: int | None = None
    activations: str = "auto"               # "auto", "gpt", "hf" or "korthikanti"
    device: str | None = None               # the device planned for (it need not be on this machine);
                                            # None: this machine's (`this_machine_device`)
    cuda_context_bytes: float | None = None  # default: CUDA_CONTEXT (0.47 GiB) on CUDA, 0 elsewhere
    overhead_fraction: float = 0.0          # temporary buffers and fragmentation, a share of the rest
    optimizer_bytes: float | None = None    # per-param optimizer state, overriding the optimizer's
    grad_bytes: float | None = None         # per-param gradient bytes, overriding the precision's
    sequence_parallel: bool = False
    attention: str | None = None            # "sdpa", "math"/"eager", "flash" (default: the config's)
    parallel: str | None = None             # "ddp", "fsdp", "fsdp_grad_op", "hsdp": sets zero_stage, dp
    world_size: int = 1
    nodes: int = 1
    weights: str | None = None              # the parameters' dtype (half: pure half training)
    layout: str | None = None               # a key of registry.MEMORY_LAYOUTS; default "mixed"

    def __post_init__(self):
        key, deprecation = memory_layout(self.precision, self.weights, self.layout)
        object.__setattr__(self, "layout_key", key)   # derived once: what the bytes per param follow
        object.__setattr__(self, "deprecation", deprecation)
        for name in ("world_size", "nodes"):
            validate.whole(name, getattr(self, name))
        if self.parallel is None and (self.world_size, self.nodes) != (1, 1):
            raise ValueError(f"world_size={self.world_size!r} and nodes={self.nodes!r} describe a sharded run: "
                             "give parallel='ddp', 'fsdp', 'fsdp_grad_op' or 'hsdp' with them (or zero_stage= "
                             "and dp=)")
        zero_stage, dp, _ = self.sharded
        for name, v in (("tp", self.tp), ("pp", self.pp), ("dp", dp)):
            validate.count(name, v, "a positive integer")
        validate.one_of("zero_stage", zero_stage, (0, 1, 2, 3))
        validate.flag("checkpointing", self.checkpointing)
        validate.flag("sequence_parallel", self.sequence_parallel)
        if self.device is not None:
            validate.device("device", self.device)
        validate.fraction("overhead_fraction", self.overhead_fraction)
        for name in ("cuda_context_bytes", "optimizer_bytes", "grad_bytes"):
            if getattr(self, name) is not None:
                validate.real(name, getattr(self, name), low_open=False)
        if self.n_params is not None:
            validate.real("n_params", self.n_params, low=1, low_open=False)
        validate.count("micro_batch", self.micro_batch)
        for name in ("seq_len", "n_layer", "n_embd", "n_head"):
            if getattr(self, name) is not None:
                validate.count(name, getattr(self, name))
        validate.one_of("activations", self.activations, ACTIVATION_MODES)

    @property
    def planned_device(self) -> tuple:
        """(device, why): the device given, or this machine's (see `this_machine_device`)."""
        if self.device is not None:
            return self.device, "given"
        return this_machine_device()

    @property
    def sharded(self) -> tuple:
        """(zero_stage, dp, notes): as given, or as `parallel` sets them for `world_size` ranks on
        `nodes` nodes (tunekit.parallel): DDP replicates (stage 0 over the world), FSDP shards
        parameters, gradients and optimizer state over the world (stage 3), HSDP over one node."""
        if self.parallel is None:
            return self.zero_stage, self.dp, []
        return _sharding(self.parallel, self.world_size, self.nodes, self.zero_stage, self.dp)


# estimate_memory's keywords that a Setting gives instead, and their defaults
SETTING_KEYWORDS = ("precision", "weights", "layout", "optimizer", "micro_batch", "seq_len", "checkpointing",
                    "attention", "parallel", "world_size", "nodes", "device")


def setting_options(setting, kw: dict) -> dict:
    """estimate_memory's keywords from a `Setting` (one description per call: a step keyword
    given beside it, away from its default, is refused)."""
    defaults = {f.name: f.default for f in fields(MemoryOptions)}
    s = from_keywords(setting, "estimate_memory", **{k: kw[k] for k in SETTING_KEYWORDS if kw[k] != defaults[k]})
    return dict(layout=s.memory_layout, optimizer=s.optimizer, micro_batch=s.micro_batch, seq_len=s.seq_len,
                checkpointing=s.checkpointing, attention=s.attention, parallel=s.parallel,
                world_size=s.world_size, nodes=s.nodes, device=device_kind(s.device))


def device_kind(device: str | None) -> str | None:
    """The estimate's device for a Setting's: a GPU of the spec table is "cuda" (its context and
    distributed buffers are what the estimate adds), "cpu"/"cuda"/"mps" and None as they are."""
    if device is None or device_type(device) is not None:
        return device
    spec = find_spec(device)
    return "cuda" if spec is not None and spec.name != "cpu" else device

NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"   # present while Linux's NVIDIA driver is loaded


def this_machine_device() -> tuple:
    """(device, why): the device a training run started here would use, found without importing
    torch (this layer is pure): torch's own answer when the program has already imported it
    ("cuda" when ``torch.cuda.is_available()``, else "cpu", as a Lab picks), else "cuda" when an
    NVIDIA driver is visible (``/proc/driver/nvidia/version`` or ``nvidia-smi`` on PATH), else
    "cpu". ``why`` says which of these decided."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and callable(getattr(cuda, "is_available", None)):
        if cuda.is_available():
            return "cuda", "torch is imported and sees a CUDA device"
        return "cpu", "torch is imported and sees no CUDA device"
    if os.path.exists(NVIDIA_DRIVER_FILE):
        return "cuda", f"torch is not imported; an NVIDIA driver is loaded ({NVIDIA_DRIVER_FILE})"
    if shutil.which("nvidia-smi"):
        return "cuda", "torch is not imported; an NVIDIA driver is installed (nvidia-smi on PATH)"
    return "cpu", "torch is not imported and no NVIDIA driver is visible"


def _sharding(parallel, world_size, nodes, zero_stage, dp) -> tuple:
    """(zero_stage, dp, notes) of a tunekit.parallel sharding; refuses a clash with explicit ones."""
    from tunekit.core.comm import layout_problems

    errors = layout_problems(parallel, 1, nodes)
    if not errors and world_size % nodes:
        errors.append(f"world_size must be a whole multiple of nodes={nodes}, got {world_size!r}")
    if not errors and (zero_stage, dp) != (0, 1):
        errors.append("give either parallel= (with world_size, nodes) or zero_stage/dp, not both")
    if errors:
        raise ValueError("; ".join(errors))
    if parallel == "ddp":
        return 0, int(world_size), []
    shard = int(world_size) // nodes if parallel == "hsdp" else int(world_size)
    notes = [f"{parallel}: parameters, gradients and optimizer state sharded over {shard} rank(s)"
             + (f" (one node; each of the {nodes} nodes holds a replica)" if parallel == "hsdp" else "")]
    if parallel == "fsdp_grad_op":
        notes.append("SHARD_GRAD_OP keeps every unit's gathered parameters from its forward to its "
                     "backward: the peak adds up to the full weights, beyond the static lines")
    return 3, shard, notes
