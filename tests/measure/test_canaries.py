"""Canaries: the private or undocumented third-party behaviour tunekit relies on, each checked
where it is used. When an upgrade changes one, the failure names it here instead of a
measurement going silently wrong."""
import ast
import inspect
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tunekit.measure import torch_private
from tunekit.measure.flops import TunekitFlopCounter


def test_flop_counter_per_op_hook_exists_with_the_signature_we_override():
    assert hasattr(FlopCounterMode, torch_private.COUNT_HOOK)
    assert torch_private.count_hook_signature() == torch_private.COUNT_HOOK_PARAMS


def test_our_override_is_the_one_torch_calls():
    calls = []

    class Spy(TunekitFlopCounter):
        def _count_flops(self, func_packet, out, args, kwargs):
            calls.append(str(func_packet))
            return super()._count_flops(func_packet, out, args, kwargs)

    a, b = torch.randn(4, 8), torch.randn(8, 16)
    with Spy() as spy:
        a @ b
    assert calls == ["aten.mm"]
    assert spy.result().executed == 1024  # 2*4*8*16


def test_flop_counter_shows_on_the_dispatch_stack_while_active():
    assert not any(torch_private.is_flop_counter(m) for m in torch_private.dispatch_mode_stack())
    with FlopCounterMode(display=False):
        assert any(torch_private.is_flop_counter(m) for m in torch_private.dispatch_mode_stack())
    assert not any(torch_private.is_flop_counter(m) for m in torch_private.dispatch_mode_stack())


def test_the_mode_our_counter_pushes_is_the_one_whose_dispatch_is_held():
    # hold_ctrl_c_in_dispatch swaps the class of what FlopCounterMode pushed (torch >= 2.5 keeps
    # it in `.mode`): the mode on the stack must be that one, and its dispatch the held one
    seen = []
    with TunekitFlopCounter():
        top = torch_private.dispatch_mode_stack()[-1]
        seen.append(type(top).__torch_dispatch__.__qualname__)
        torch.randn(4).relu()
    assert seen == ["hold_ctrl_c_in_dispatch.<locals>.__torch_dispatch__"]
    assert torch_private.is_flop_counter(top)


def test_graph_task_id_tells_backward_from_forward():
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("forward", torch_private.in_autograd_backward()))
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(("backward", torch_private.in_autograd_backward()))
            return g * 2

    Probe.apply(torch.ones(2, requires_grad=True)).sum().backward()
    assert seen == [("forward", False), ("backward", True)]


def test_sdpa_schema_names_is_causal():
    packet = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    assert "is_causal" in torch_private.op_argument_names(packet)


def test_storage_weakref_expires_with_its_storage():
    t = torch.ones(16)
    ref = torch_private.storage_weakref(t.untyped_storage())
    assert not ref.expired()
    del t
    assert ref.expired()


def test_storage_id_is_shared_by_views_and_held_by_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    a = torch.randn(4, 8)
    assert torch_private.storage_id(a) == torch_private.storage_id(a.t())
    assert torch_private.storage_id(a) != torch_private.storage_id(torch.randn(4, 8))
    with FakeTensorMode():
        f = torch.randn(4, 8)
        assert torch_private.storage_id(f) == torch_private.storage_id(f[1:]) != 0
        assert f.untyped_storage().nbytes() == 128


def test_ipyexperiments_init_sets_what_our_bridge_sets():
    # tunekit.profiling.experiments builds IPyExperiments without its get_ipython() lookup by assigning
    # these attributes itself; a release that sets anything else must be looked at.
    ipyexperiments = pytest.importorskip("ipyexperiments.ipyexperiments")
    src = textwrap.dedent(inspect.getsource(ipyexperiments.IPyExperiments.__init__))
    assigned = {t.attr for node in ast.walk(ast.parse(src)) if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Attribute)}
    assert assigned == {"cl_enable", "cl_kwargs", "enable", "running", "reclaimed", "start_time",
                        "var_names_keep", "namespace", "shell", "var_names_start"}


def test_deprecated_pynvml_shim_is_quiet_after_import_tunekit():
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import tunekit, torch\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always'); import pynvml\n"
            "print(len([x for x in w if 'pynvml' in str(x.message)]))")
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True,
                         text=True, check=True)
    assert "deprecated" not in out.stderr and out.stdout.strip() == "0"


def test_dynamo_counts_the_graphs_it_compiles():
    net = torch.nn.Linear(8, 8)
    torch._dynamo.reset()
    before = torch_private.compiled_graphs() or 0
    torch.compile(net, backend="eager")(torch.randn(2, 8))
    assert torch_private.compiled_graphs() == before + 1
    torch._dynamo.reset()


def test_memory_profiler_timeline_gives_bytes_per_torch_category():
    # torch.profiler's memory profiler (prof._memory_profile, MemoryProfileTimeline._coalesce_timeline,
    # _CATEGORY_TO_INDEX): tunekit's memory timeline maps these categories by name
    from tunekit.core.breakdown import TORCH_MEMORY_CATEGORY

    w = torch.nn.Parameter(torch.randn(64, 64))
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        (torch.randn(8, 64) @ w).relu().sum().backward()
        opt.step()
    times, by = torch_private.memory_timeline(prof, "cpu")
    assert set(by) == set(TORCH_MEMORY_CATEGORY)  # 7 named categories and None (unknown)
    assert all(len(v) == len(times) for v in by.values()) and times == sorted(times)
    assert max(by["PARAMETER"]) == 64 * 64 * 4 and max(by["GRADIENT"]) == 64 * 64 * 4  # 16384 bytes each


def test_cuda_memory_history_and_snapshot_functions_exist_with_the_arguments_we_pass():
    params = inspect.signature(torch.cuda.memory._record_memory_history).parameters
    assert {"enabled", "max_entries"} <= set(params)
    assert "filename" in inspect.signature(torch.cuda.memory._dump_snapshot).parameters


def test_c10_log_level_can_be_read_and_set():
    # torch_private.cpp_min_log_level mutes the memory profiler's C++ stderr line during a trace
    before = torch_private.cpp_min_log_level()
    assert before in (0, 1, 2, 3)  # 1 (WARNING) unless TORCH_CPP_LOG_LEVEL says otherwise
    assert torch_private.cpp_min_log_level(2) == before and torch_private.cpp_min_log_level(before) == 2
    assert torch_private.cpp_min_log_level() == before


def test_dispatch_mode_sees_c10d_collectives_and_their_process_group():
    """measure/comm.py counts collectives through a dispatch mode and unboxes the group."""
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        seen = []

        class Spy(torch_private.dispatch_mode_class()):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.namespace == "c10d":
                    group = next(a for a in args if isinstance(a, torch.ScriptObject)
                                 and "ProcessGroup" in str(a._type()))
                    seen.append((func.__name__.split(".")[0],
                                 dist.get_process_group_ranks(torch_private.unbox_process_group(group))))
                return func(*args, **(kwargs or {}))

        with Spy():
            dist.all_reduce(torch.ones(3))
        assert seen == [("allreduce_", [0])]
    finally:
        dist.destroy_process_group()


def test_a_fake_tensors_item_reads_one_under_fake_scalar_reads_and_a_real_ones_its_value():
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = torch.full((3,), 2.0)
    with FakeTensorMode():
        fake = torch.full((3,), 2.0)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
        assert torch_private.has_fake_params(opt)
        with torch_private.fake_scalar_reads():
            # torch's own op for .item() (aten._local_scalar_dense) is the one answered
            assert fake.sum().item() == 1.0 and fake.long().sum().item() == 1
            assert (fake > 0).any().item() is True
    with torch_private.fake_scalar_reads():
        assert real.sum().item() == 6.0   # 2 + 2 + 2: a real tensor's value passes through
    assert not torch_private.has_fake_params(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1))


def test_fake_scalar_reads_for_answers_reads_only_around_a_fake_optimizer():
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    real_opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    with FakeTensorMode():
        fake = torch.full((3,), 2.0)
        fake_opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
        with torch_private.fake_scalar_reads_for(fake_opt):
            assert fake.sum().item() == 1.0   # answered: the optimizer steps fake tensors
        with torch_private.fake_scalar_reads_for(real_opt):
            with pytest.raises(DataDependentOutputException):   # not answered: a fake tensor has no value to read
                fake.sum().item()


def test_autograd_numbers_nodes_in_creation_order_and_names_the_one_backward_runs():
    """measure.live tells the nodes a module's forward made by their sequence numbers and places a
    backward op by the node running: both private (torch_private)."""
    start = torch_private.autograd_sequence_nr()
    x = torch.randn(3, requires_grad=True)
    a = x * 2
    b = a.relu()
    assert start <= torch_private.node_sequence_nr(a.grad_fn) < torch_private.node_sequence_nr(b.grad_fn)
    seen = []
    b.grad_fn.register_prehook(lambda g: seen.append(torch_private.current_autograd_node()))
    b.sum().backward()
    assert seen and seen[0] is b.grad_fn
    assert torch_private.current_autograd_node() is None
