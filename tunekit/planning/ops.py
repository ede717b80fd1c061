"""The plan's op-by-op count over its fake step: every op that launches a kernel, with its FLOPs,
the bytes it reads and writes and, for a matmul, its shape. One counting pass feeds the roofline
bound and the expectation (core.expected)."""
from __future__ import annotations

import functools

import torch

from tunekit.measure.flops import TunekitFlopCounter
from tunekit.measure.model_flops import tensors_in
from tunekit.measure.torch_private import in_autograd_backward, storage_id, storage_weakref

# ops that make no kernel: views, metadata, and what a fake step does for its own bookkeeping
_FREE = {"detach", "alias", "lift_fresh", "_to_copy_meta", "sym_size", "sym_stride", "sym_numel", "empty",
         "empty_like", "empty_strided", "_local_scalar_dense", "is_same_size", "set_", "resize_"}
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "_addmm_activation", "linear", "matmul"}
# in-place scatters (self, dim, index, ...): they read and write only self's elements the index names
_SCATTERS = {"scatter_", "scatter_add_", "scatter_reduce_"}
_view_memo: dict = {}
_pointwise_memo: dict = {}


def is_view(packet) -> bool:
    """Whether every overload of this op returns a view of an input (no data moved)."""
    if packet not in _view_memo:
        try:
            overloads = [getattr(packet, o) for o in packet.overloads()]
            _view_memo[packet] = bool(overloads) and all(getattr(o, "is_view", False) for o in overloads)
        except Exception:   # an op without a schema: counted
            _view_memo[packet] = False
    return _view_memo[packet]


def is_pointwise(packet) -> bool:
    """Whether an op is elementwise (torch's ``pointwise`` tag on one of its overloads)."""
    if packet not in _pointwise_memo:
        try:
            _pointwise_memo[packet] = any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())
        except Exception:   # an op without a schema: none
            _pointwise_memo[packet] = False
    return _pointwise_memo[packet]


def _category(dtype) -> int:
    return 3 if dtype.is_complex else 2 if dtype.is_floating_point else 0 if dtype == torch.bool else 1


def promoted_inputs(packet, ins, outs) -> list:
    """(input, dtype) of each tensor a CPU elementwise op first copies to the op's common dtype,
    into a temporary of its own, then runs its kernel at that dtype: ATen's TensorIterator on a CPU
    (`TensorIteratorBase::compute_types`, pytorch/pytorch aten/src/ATen/TensorIterator.cpp: "Promotes
    inputs by creating temporaries of the correct dtype", ``op.tensor().to(common_dtype_)`` under
    ``common_device == kCPU``; a CUDA kernel casts as it loads, and a fake tensor's meta kernel makes no
    copy). Under autocast: a bf16 linear's output added to the fp32 residual, rotary's bf16 q times its
    fp32 cos. The common dtype: the promoted dtype of the dimensioned inputs, a 0-dim input's only where
    its category is higher, the output's where that is higher still (an integer divided: float); a
    ``where``'s condition stays bool. Python numbers are cast the same way (a 0-dim copy each) in every
    precision alike: they are no tensors here, and left out."""
    if not outs or not ins or not is_pointwise(packet):
        return []
    ins = [t for t in ins if not (str(packet) == "aten.where" and t.dtype == torch.bool)]
    big = [t.dtype for t in ins if t.dim() > 0]
    common = functools.reduce(torch.promote_types, big or [t.dtype for t in ins])
    for t in ins if big else ():
        if t.dim() == 0 and _category(t.dtype) > _category(common):
            common = torch.promote_types(common, t.dtype)
    out = outs[0].dtype
    if out != torch.bool and _category(out) > _category(common):
        common = out
    return [(t, common) for t in ins if t.dtype != common]


def promoted_bytes(func, args, kwargs, out) -> int:
    """The bytes of a CPU op's copies of its inputs at its common dtype (`promoted_inputs`): alive
    while it runs (`measure.live.LiveBytes`'s scratch)."""
    ins, outs = list(tensors_in((args, kwargs or {}), levels=3)), list(tensors_in(out, levels=2))
    return sum(t.numel() * d.itemsize for t, d in promoted_inputs(getattr(func, "overloadpacket", func), ins, outs))


def kind_of(name: str, flops: int) -> str:
    if name in _MATMULS:
        return "matmul"
    if "attention" in name or "scaled_dot_product" in name:
        return "attention"
    return "flops" if flops else "memory"


def matmul_dims(name: str, args) -> tuple | None:
    """(m, k, n, batch) of a matmul's operands."""
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm", "_addmm_activation") else (args[0], args[1])
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() < 2 or b.dim() < 2:
        return None
    batch = a.shape[0] if a.dim() == 3 else 1
    return int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1]), int(batch)


def attention_dims(name: str, args) -> tuple | None:
    """(seq_q, seq_k, head_dim, batch x heads) of a fused attention op (its backward takes the
    output's gradient first)."""
    i = 1 if "backward" in name else 0
    q, k = (args[i], args[i + 1]) if len(args) > i + 1 else (None, None)
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)) or q.dim() < 3 or k.dim() < 3:
        return None
    return int(q.shape[-2]), int(k.shape[-2]), int(q.shape[-1]), int(q.numel() // (q.shape[-2] * q.shape[-1]))


def _aliases(ins, outs) -> bool:
    held = {storage_id(t) for t in ins}
    return all(storage_id(t) in held for t in outs)


class RooflineCounter(TunekitFlopCounter):
    """TunekitFlopCounter that also keeps each op that launches a kernel as an op record
    (core.expected): name, kind, phase, FLOPs (causal attention halved), the bytes of its inputs
    read and outputs written, a matmul's or an attention's dims, the itemsize of its first tensor, its inputs'
    and outputs' (storage, bytes), which tell a compiled step's fusion what stays on chip, and its
    tensors' dtypes (`dtype_signature`). Views and
    metadata ops make no kernel: they are only counted (``no_kernel``), as the module calls are
    (``module_calls``, a recomputing backward's included), the tensors a backward's recompute
    saves (``saved``: a checkpoint's hook detaches each, grad off, amid the recompute) and the
    runs of recomputed ops (``segments``: one per checkpointed segment): a CPU's host spends time
    on each (`host_calls`). ``kernels`` (a GPU plan's `cuda_like.GpuKernels`): an op the GPU runs
    another kernel for (CPU's SDPA) is recorded and counted as that kernel, by torch's formula for it."""

    def __init__(self, kernels=None):
        super().__init__()
        self._kernels = kernels

    def __enter__(self):
        self.ops = []
        self._serials = {}   # a storage's address -> (its number, a weak reference to it)
        self._count = 0
        self.no_kernel = self.module_calls = self.saved = self.segments = 0
        self._recomputing = False
        self._calls = torch.nn.modules.module.register_module_forward_pre_hook(self._called)
        try:
            return super().__enter__()
        except BaseException:
            self._calls.remove()
            raise

    def __exit__(self, *exc):
        self._calls.remove()
        return super().__exit__(*exc)

    def _called(self, module, args):
        self.module_calls += 1

    def host_calls(self) -> dict:
        """What the step's host does with no kernel of its own (core.expected.host_rows)."""
        return dict(no_kernel=self.no_kernel, modules=self.module_calls, saved=self.saved, segments=self.segments)

    def _serial(self, t) -> int:
        """A storage's number in order of first sight. An address freed and then reused by a new
        storage gets a new number: two storages are never taken for one, so a plan's figures do
        not depend on which addresses the allocator happened to reuse."""
        key = storage_id(t)
        seen = self._serials.get(key)
        if seen is None or seen[1].expired():
            self._count += 1
            seen = self._serials[key] = (self._count, storage_weakref(t.untyped_storage()))
        return seen[0]

    def _count_flops(self, func_packet, out, args, kwargs):
        gpu = self._kernels.kernel(func_packet, args, kwargs) if self._kernels is not None else None
        name = str(func_packet)
        if gpu is not None:   # the GPU's kernel: its name, and its FLOPs by torch's formula, from its arguments
            name, func_packet, args, kwargs = "aten." + gpu[0], gpu[1], gpu[2], {}
        before = self.get_total_flops()
        result = super()._count_flops(func_packet, out, args, kwargs)
        flops = self.get_total_flops() - before
        if not name.startswith("aten."):
            return result   # prims: the fake step's own
        backward, grad = in_autograd_backward(), torch.is_grad_enabled()
        if self._recomputing and backward and not grad and name == "aten.detach":
            self.saved += 1   # a checkpoint's hook saving a recomputed tensor (its cost): the recompute goes on
            return result
        recomputing = backward and grad   # a checkpoint's recompute
        self.segments += recomputing and not self._recomputing
        self._recomputing = recomputing
        if name[5:] in _FREE or (not flops and is_view(func_packet)):
            self.no_kernel += 1   # metadata and views make no kernel
            return result
        name = name[5:]
        ins, outs = list(tensors_in((args, kwargs), levels=3)), list(tensors_in(out, levels=2))
        if not outs:
            return result
        if not flops and not name.endswith("_") and _aliases(ins, outs):
            self.no_kernel += 1
            return result   # a view by its result (_unsafe_view, split): no data moved
        phase = "backward" if in_autograd_backward() else "forward"
        # a CPU's elementwise op over mixed dtypes: a cast of each input to the common dtype first, the
        # kernel then at that dtype over the copies (promoted_inputs; a GPU plan's kernels cast as they load)
        cast = {id(t): d for t, d in promoted_inputs(func_packet, ins, outs)} if self._kernels is None else {}
        copies = {id(t): self._cast(t, cast[id(t)], phase) for t in ins if id(t) in cast}
        in_io = tuple(copies.get(id(t)) or (self._serial(t), t.nbytes) for t in ins)
        tensors = ins + outs
        moved = sum(t.nbytes for t in outs) + sum(b for _, b in in_io)
        if name in _SCATTERS and len(ins) > 1:   # the index and source read, self touched where indexed
            moved = sum(t.nbytes for t in ins[1:]) + 2 * ins[1].numel() * ins[0].element_size()
        kind = kind_of(name, flops)
        dims = (matmul_dims(name, args) if kind == "matmul" else attention_dims(name, args)
                if kind == "attention" else None)
        io = (in_io, tuple((self._serial(t), t.nbytes) for t in outs))
        dtypes = [cast.get(id(t), t.dtype) for t in ins]
        itemsize = dtypes[0].itemsize if ins else tensors[0].element_size()
        self.ops.append((name, kind, phase, flops, moved, dims, itemsize, io, dtype_signature(dtypes, outs)))
        return result

    def _cast(self, t, dtype, phase) -> tuple:
        """The record of an input's copy to ``dtype`` ahead of its op (`promoted_inputs`); returns the
        copy's (number, bytes): a storage of its own, freed when the op ends."""
        self._count += 1
        copy = (self._count, t.numel() * dtype.itemsize)
        io = (((self._serial(t), t.nbytes),), (copy,))
        self.ops.append(("_to_copy", "memory", phase, 0, t.nbytes + copy[1], None, t.element_size(), io,
                         dtype_signature([t.dtype], [dtype])))
        return copy


def dtype_signature(ins, outs) -> str:
    """Which kernel an op's record ran, by its tensors' (or dtypes') dtypes: "float32" (inputs and outputs
    alike), "float32>bfloat16" (a cast), "float32,int64>float32" (an embedding's lookup). One aten
    name runs other kernels at other dtypes (a CPU's bf16 matmul, SDPA or cast is not its fp32 one
    at half the bytes): lab.expect carries a measured op's factor only to the same signature."""
    def names(ts):
        return ",".join(sorted({str(getattr(t, "dtype", t)).removeprefix("torch.") for t in ts}))
    i, o = names(ins), names(outs)
    return i if i == o else f"{i}>{o}"

