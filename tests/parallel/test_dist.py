"""Distributed runs on CPU ranks (gloo): DDP, FSDP, SHARD_GRAD_OP and HSDP against one process,
per-rank memory against estimate_memory, collective bytes against the formulas, failures,
interrupts and bad input. The model is dist_factories.tiny_gpt: vocab 255 (so FSDP pads the
embedding's dim 0), 2 layers, n_embd 64, 4 heads, block_size 32."""
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch

from tunekit.core.comm import expected_comm, layout_problems, padded_numel, total_by
from tunekit.core.memory.estimate import estimate_memory
from tunekit.models.data import Batcher
from tunekit.models.optimizers import build_optimizer
from tunekit.models.spec import build_model, factory_spec, model_spec
from tunekit.parallel import launch as launch_mod
from tunekit.parallel.launch import DistRunError, launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # `tests` imports from here
MB, T, STEPS, WARMUP = 2, 32, 2, 3  # 3: DDP's second iteration has one-off broadcasts
LAYOUTS = {"ddp": (2, 1), "fsdp": (2, 1), "fsdp_grad_op": (2, 1), "hsdp": (2, 2)}  # nproc, nodes
# one launch per path in `make test` (DDP, FSDP2, HSDP over 2 nodes); SHARD_GRAD_OP, FSDP2 kept
# unsharded after forward, in `make test-slow` (its formulas: test_formulas_pad_dim0_and_drop_nothing)
PATHS = [pytest.param(p, marks=pytest.mark.slow) if p == "fsdp_grad_op" else p for p in LAYOUTS]


def spec(parallel, factory="tests.parallel.dist_factories:tiny_gpt", **extra):
    return {"model": factory_spec(factory), "parallel": parallel, "steps": STEPS, "warmup": WARMUP,
            "seed": 0, "toggles": {"micro_batch": MB, "seq_len": T}, "peak_tflops": 1.0, **extra}
# Per step, FSDP2's gathered units: 2 x 49,280 + 16,448 = 115,008 elements (see EXPECTED)


def leftover_children():
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]


_RUNS = {}


def run(parallel):
    """One launch per sharding, shared by the tests below (each costs seconds)."""
    if parallel not in _RUNS:
        nproc, nodes = LAYOUTS[parallel]
        _RUNS[parallel] = launch(spec(parallel), nproc=nproc, nodes=nodes)
        assert leftover_children() == []
    return _RUNS[parallel]


def single_process_losses(world, steps, grad_accum=1):
    """The same model, seed and global batch (MB x world samples per micro-step) in this process."""
    torch.manual_seed(0)
    model = build_model(factory_spec("tests.parallel.dist_factories:tiny_gpt"), seed=0)
    batcher = Batcher("synthetic", seed=0, vocab_size=255)  # vocab < 256: synthetic, as the Lab
    opt = build_optimizer("adamw", model.parameters(), 1e-3)
    out = []
    for _ in range(steps):
        total = 0.0
        for _ in range(grad_accum):
            x, y = batcher.get(MB * world, T)
            loss = model(x, y)[1] / grad_accum
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(total)
    return out


@pytest.mark.parametrize("parallel", PATHS)
def test_same_losses_as_one_process_on_the_same_global_batch(parallel):
    r = run(parallel)
    nproc, nodes = LAYOUTS[parallel]
    assert (r.world_size, r.nodes, r.parallel, r.status) == (nproc * nodes, nodes, parallel, "ok")
    ref = single_process_losses(nproc * nodes, WARMUP + STEPS)
    assert len(r.losses) == WARMUP + STEPS
    assert r.losses == pytest.approx(ref, abs=1e-5)
    assert r.tokens_per_step == MB * T * nproc * nodes   # global: 2*32*world
    assert len(r.peak_mem_bytes_per_rank) == nproc * nodes
    assert r.peak_mem_bytes == max(r.peak_mem_bytes_per_rank)
    assert r.launch_s > 0 and r.comm_wait_s is None and any("comm_wait_s" in n for n in r.notes)


@pytest.mark.parametrize("parallel", PATHS)
def test_per_rank_params_grads_optimizer_within_10pct_of_the_estimate(parallel):
    r = run(parallel)
    nproc, nodes = LAYOUTS[parallel]
    est = estimate_memory(build_model(factory_spec("tests.parallel.dist_factories:tiny_gpt")).config, precision="fp32",
                          optimizer="adamw", device="cpu", parallel=parallel,
                          world_size=nproc * nodes, nodes=nodes)
    measured = r.params_bytes + r.grads_bytes + r.optimizer_bytes
    # 114,944 params x (4 + 4 + 8) B = 1,839,104 B on a DDP rank; / 2 for the sharded kinds; + AdamW's
    # 4-byte step tensor for each of the 14 parameter tensors (56 B), whole on every rank
    assert est.static_bytes == 1_839_104 / (1 if parallel == "ddp" else 2) + 14 * 4
    assert measured == pytest.approx(est.static_bytes, rel=0.10)


@pytest.mark.parametrize("parallel", PATHS)
def test_a_plan_gives_rank_0_the_bytes_its_run_measured(parallel):
    """tunekit.plan's per-rank weights, gradients and AdamW state equal what the ranks held (the
    run reports each line's largest rank: rank 0, which FSDP2 gives ceil(255 / 2) = 128 rows of
    the embedding)."""
    import tunekit

    r = run(parallel)
    nproc, nodes = LAYOUTS[parallel]
    cfg = build_model(factory_spec("tests.parallel.dist_factories:tiny_gpt")).config
    p = tunekit.plan(cfg, "cpu", precision="fp32", optimizer="adamw", micro_batch=MB, seq_len=T,
                     parallel=parallel, world_size=nproc * nodes, nodes=nodes)
    # DDP: 114,944 params x 4 B; sharded over 2: (128 x 64 + 49,280 + 32) x 4 = 230,016; AdamW:
    # two moments of those + one 4-byte step count per parameter tensor, kept whole on every rank
    assert (p.components["weights"], p.components["gradients"], p.components["optimizer_states"]) == \
        (r.params_bytes, r.grads_bytes, r.optimizer_bytes)
    assert p.components["weights"] == (459_776 if parallel == "ddp" else 230_016)


# Per step, 4-byte elements. Units: 2 blocks of 64 + 192*64 + 64*64 + 64 + 256*64 + 64*256
# = 49,280 elements (every dim 0 even: no padding over 2 ranks) and the root: wte (255, 64)
# padded to (256, 64) = 16,384 + norm_f 64 = 16,448. Gathered: 2*49,280 + 16,448 = 115,008.
EXPECTED = {
    # all-reduce of 114,944 trained elements (255*64 + 2*49,280 + 64) x 4 B; rope buffers
    # 2 x (32, 16) fp32 = 4,096 B broadcast at the first forward after a gradient sync
    "ddp": {"all_reduce/intra": (None, 459_776), "broadcast/intra": (1, 4_096)},
    # forward + backward all-gather of 3 units: 2 x 115,008 x 4; reduce-scatter 115,008 x 4
    "fsdp": {"all_gather/intra": (6, 920_064), "reduce_scatter/intra": (3, 460_032)},
    "fsdp_grad_op": {"all_gather/intra": (3, 460_032), "reduce_scatter/intra": (3, 460_032)},
    # FULL_SHARD inside each node of 2, then each rank's shard (115,008 / 2 x 4 B) across nodes
    "hsdp": {"all_gather/intra": (6, 920_064), "reduce_scatter/intra": (3, 460_032),
             "all_reduce/inter": (3, 230_016)},
}


@pytest.mark.parametrize("parallel", PATHS)
def test_measured_bytes_per_step_equal_the_formulas(parallel):
    r = run(parallel)
    measured = {k: (v["count"], v["bytes"]) for k, v in r.comm["per_step"].items()}
    expected = {k: (v["count"], v["bytes"]) for k, v in r.comm["expected"].items()}
    assert expected == EXPECTED[parallel]
    if parallel == "ddp":  # bucketing decides the all-reduce count: compare bytes only
        measured["all_reduce/intra"] = (None, measured["all_reduce/intra"][1])
    assert measured == EXPECTED[parallel]
    assert r.comm["ranks_agree"] and r.comm["other_ops"] == {} and r.comm["step_counted"] == WARMUP


@pytest.mark.parametrize("parallel", ["fsdp", pytest.param("ddp", marks=pytest.mark.slow)])
def test_grad_accum_syncs_gradients_once_per_step(parallel):
    r = launch(spec(parallel, toggles={"micro_batch": MB, "seq_len": T, "grad_accum": 2}), nproc=2)
    assert r.losses == pytest.approx(single_process_losses(2, WARMUP + STEPS, grad_accum=2), abs=1e-5)
    per_step = {k: (v["count"], v["bytes"]) for k, v in r.comm["per_step"].items()}
    if parallel == "fsdp":  # gathered at both micro-steps (2 x 6), reduce-scattered once (3)
        assert per_step == {"all_gather/intra": (12, 1_840_128), "reduce_scatter/intra": (3, 460_032)}
    else:  # one gradient all-reduce; the buffers broadcast once, not at the no_sync micro-step
        assert per_step["all_reduce/intra"][1] == 459_776 and per_step["broadcast/intra"] == (1, 4_096)
    assert r.comm["per_step"] == {k: v for k, v in r.comm["expected"].items() if v["count"] is not None} \
        or parallel == "ddp"


def test_estimate_memory_takes_a_sharding_or_zero_stage_not_both():
    # 1e6 params x 16 B (fp32 + AdamW) = 16e6 B; FSDP over 4 ranks: 4e6; HSDP 2 nodes x 2: 8e6
    kw = dict(precision="fp32", optimizer="adamw", device="cpu", n_layer=1, n_embd=8, n_head=1, seq_len=4)
    assert estimate_memory(1e6, parallel="ddp", world_size=4, **kw).static_bytes == 16e6
    assert estimate_memory(1e6, parallel="fsdp", world_size=4, **kw).static_bytes == 4e6
    assert estimate_memory(1e6, parallel="hsdp", world_size=4, nodes=2, **kw).static_bytes == 8e6
    with pytest.raises(ValueError, match="not both"):
        estimate_memory(1e6, parallel="fsdp", world_size=4, zero_stage=3, **kw)
    with pytest.raises(ValueError, match="needs nodes >= 2"):
        estimate_memory(1e6, parallel="hsdp", world_size=4, **kw)
    with pytest.raises(ValueError, match="whole multiple"):
        estimate_memory(1e6, parallel="fsdp", world_size=3, nodes=2, **kw)


def test_hsdp_sends_nothing_but_the_shard_all_reduce_across_nodes():
    r = run("hsdp")
    inter = {k: v for k, v in r.comm["per_step"].items() if k.endswith("/inter")}
    assert inter == {"all_reduce/inter": {"count": 3, "bytes": 230_016}}
    assert r.comm["by_scope"]["inter"] == {"count": 3, "bytes": 230_016}


def test_formulas_pad_dim0_and_drop_nothing():
    assert padded_numel((255, 64), 2) == 16_384    # ceil(255/2) = 128 rows x 2 ranks x 64
    assert padded_numel((255, 64), 4) == 16_384    # 64 rows x 4
    assert padded_numel((7,), 4) == 8
    units = [[(384, 128), (128,)], [(255, 128)]]
    # (49,152 + 128) + 256*128 = 82,048 elements; over 2 nodes of 2 the shard is 41,024
    out = expected_comm("hsdp", units, world=4, nodes=2, param_bytes=2, grad_bytes=4)
    assert out == {"all_gather/intra": {"count": 4, "bytes": 2 * 82_048 * 2},
                   "reduce_scatter/intra": {"count": 2, "bytes": 82_048 * 4},
                   "all_reduce/inter": {"count": 2, "bytes": 41_024 * 4}}
    assert total_by(out, "scope") == {"intra": {"count": 6, "bytes": 656_384},
                                      "inter": {"count": 2, "bytes": 164_096}}
    # FULL_SHARD across 2 nodes: every collective crosses them
    assert set(expected_comm("fsdp", units, world=4, nodes=2)) == {"all_gather/inter", "reduce_scatter/inter"}
    # grad_accum=2: gathered at every micro-step, scattered once
    ga = expected_comm("fsdp_grad_op", units, world=2, grad_accum=2)
    assert ga["all_gather/intra"]["count"] == 4 and ga["reduce_scatter/intra"]["count"] == 2


def test_a_failing_rank_comes_back_with_its_traceback_and_nothing_is_left():
    with pytest.raises(DistRunError) as info:
        launch(spec("ddp", factory="tests.parallel.dist_factories:fails_on_rank_1"), nproc=2)
    assert info.value.rank == 1
    assert "rank 1 was told to fail" in info.value.traceback
    assert "Traceback" in info.value.traceback and "fails_on_rank_1" in info.value.traceback
    assert "rank 1 failed" in str(info.value)
    assert leftover_children() == []


def test_the_rank_that_failed_first_is_not_one_that_lost_its_peer(tmp_path):
    # one CI run: rank 1 raised in its factory and rank 0's gloo set-up lost it in the same second
    # (error files keep whole seconds); the rank named was 0, whose error is the consequence
    def error_file(node, local, message, ts):
        f = tmp_path / f"node{node}" / str(local) / "error.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps({"message": {"message": message, "extraInfo": {
            "py_callstack": f"Traceback (most recent call last):\n  ...\n{message}\n", "timestamp": str(ts)}}}))

    error_file(0, 0, "RuntimeError: Gloo connectFullMesh failed with [...] Connection closed by peer", 1795795054)
    error_file(0, 1, "RuntimeError: rank 1 was told to fail", 1795795054)
    err = launch_mod._netns_failure(tmp_path, nodes=1, nproc=2, procs=[])
    assert err.rank == 1 and "told to fail" in err.traceback and set(err.failures) == {0, 1}
    # with no cause of its own on any rank, the first by time is named
    error_file(1, 0, "RuntimeError: Connection reset by peer", 1795795050)
    assert launch_mod._netns_failure(tmp_path, nodes=2, nproc=2, procs=[]).rank == 1


@pytest.mark.parametrize("bad,msg", [
    (dict(parallel="zero3"), "parallel must be one of"),
    (dict(parallel="hsdp", nodes=1), "needs nodes >= 2"),
    (dict(parallel="fsdp", nproc=0), "nproc must be a whole number >= 1"),
    (dict(parallel="fsdp", nproc=1.5), "nproc must be a whole number >= 1"),
    (dict(parallel="ddp", nodes=True), "nodes must be a whole number >= 1"),
    (dict(parallel="ddp", toggles={"micro_batch": 0}), "micro_batch must be a whole number >= 1"),
    (dict(parallel="ddp", toggles={"precision": "fp16"}), "fp16 training is refused on CPU"),
    (dict(parallel="fsdp", toggles={"compile": True}), "compile is not applied"),
    (dict(parallel="fsdp", link={"speed": "1gbit"}), "link is a dict with bandwidth"),
])
def test_bad_layouts_are_refused_before_anything_starts(bad, msg, monkeypatch):
    started = []
    monkeypatch.setattr(launch_mod, "_run_local", lambda *a: started.append(a))
    kw = {"nproc": 2, "nodes": 1, **bad}
    extra = {"toggles": kw.pop("toggles")} if "toggles" in kw else {}
    with pytest.raises(ValueError, match=msg):
        launch(spec(kw.pop("parallel"), **extra), **kw)
    assert started == []


def test_lab_refuses_before_launch(monkeypatch):
    import tunekit

    started = []
    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: started.append(a))
    lab = tunekit.Lab(model=torch.nn.Sequential(torch.nn.Linear(4, 4)),
                      batch_fn=lambda b, s: (torch.randn(b, 4), torch.randn(b, 4)),
                      loss_fn=lambda m, x, y: ((m(x) - y) ** 2).mean(), log_path=os.devnull)
    with pytest.raises(ValueError, match="factory"):
        lab.run(parallel="ddp", nproc=2, seq_len=1)
    gpt = tunekit.Lab(config=build_model(factory_spec("tests.parallel.dist_factories:tiny_gpt")).config,
                      log_path=os.devnull)
    with pytest.raises(ValueError, match="needs nodes >= 2"):
        gpt.run(parallel="hsdp", nproc=2)
    with pytest.raises(ValueError, match="micro_batch"):
        gpt.run(parallel="ddp", nproc=2, micro_batch=0)
    assert started == []
    assert layout_problems("ddp", 2, 1) == []
    assert model_spec(gpt.model)["kind"] == "gpt"


def test_the_lab_runs_and_logs_a_distributed_run(tmp_path, make_lab):
    lab = make_lab(model="tests.parallel.dist_factories:tiny_gpt", peak_tflops=1.0)
    seen = []
    r = lab.run(steps=STEPS, warmup=WARMUP, micro_batch=MB, seq_len=T, parallel="fsdp", nproc=2,
                progress=lambda done, total: seen.append((done, total)))
    # the Lab's weights are the factory's at seed 0: the same curve as the launch above
    assert r.losses == pytest.approx(single_process_losses(2, WARMUP + STEPS), abs=1e-5)
    assert seen[-1] == (STEPS, STEPS)
    assert r.label.startswith("fsdp 1x2") and r.model == "GPT"  # not fully_shard's FSDPGPT
    # MFU per device: model FLOPs / step time / (2 ranks x 1 TFLOPS)
    assert r.mfu == pytest.approx(r.model_flops_per_step / r.step_s / 2e12)
    logged = [json.loads(line) for line in open(tmp_path / "runs.jsonl")]
    assert logged[-1]["parallel"] == "fsdp" and logged[-1]["world_size"] == 2
    assert lab.results(all=True)["parallel"].tolist() == ["fsdp"]
    assert leftover_children() == []


class FakeNodes:
    """tunekit.parallel.netns.EmulatedNodes' interface on localhost: every node is this machine."""

    def __init__(self, nodes, bandwidth=None, latency=None):
        self.addresses, self.ifname = ["127.0.0.1"] * nodes, "lo"
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]

    def exec_prefix(self, i):
        return []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.slow
def test_the_emulated_node_path_starts_one_torchrun_per_node(monkeypatch):
    fake = type("netns", (), {"check": staticmethod(lambda: None), "EmulatedNodes": FakeNodes})
    monkeypatch.setattr(launch_mod, "_netns", lambda: fake)
    r = launch(spec("hsdp"), nproc=1, nodes=2, link={"bandwidth": "50mbit", "latency": "1ms"})
    assert r.losses == pytest.approx(single_process_losses(2, WARMUP + STEPS), abs=1e-5)
    # shards of 1 rank: no gather, no scatter, no padding; the whole gradient (114,944 x 4 B)
    # across the nodes, once per unit
    assert r.comm["per_step"] == {"all_reduce/inter": {"count": 3, "bytes": 459_776}}
    assert r.comm["expected"] == r.comm["per_step"]
    assert leftover_children() == []


def test_emulated_nodes_unavailable_say_why(monkeypatch):
    fake = type("netns", (), {"check": staticmethod(lambda: "needs root (CAP_NET_ADMIN)")})
    monkeypatch.setattr(launch_mod, "_netns", lambda: fake)
    with pytest.raises(RuntimeError, match="needs root"):
        launch(spec("fsdp"), nproc=1, nodes=2, link={"bandwidth": "50mbit"})


@pytest.mark.slow
def test_ctrl_c_leaves_no_rank_behind(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from tunekit.parallel.launch import launch
        from tunekit.models.spec import factory_spec
        spec = {{"model": factory_spec("tests.parallel.dist_factories:tiny_gpt"), "parallel": "fsdp", "steps": 500,
                 "warmup": 0, "toggles": {{"micro_batch": 2, "seq_len": 32}}, "peak_tflops": 1.0}}
        try:
            launch(spec, nproc=2, progress=lambda d, t: print("step", d, flush=True))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("step")
        ranks = psutil.Process(proc.pid).children(recursive=True)
        assert len([p for p in ranks if "tunekit.parallel.worker" in " ".join(p.cmdline())]) == 2
        proc.send_signal(signal.SIGINT)  # what a notebook's interrupt sends the kernel
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "interrupted" in out

    def alive():
        out = []
        for p in ranks:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return out

    deadline = time.monotonic() + 30   # a liveness bound, not a timing: their exit lands within ms
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive() == []


def test_gpu_path_picks_nccl_and_the_local_device(monkeypatch):
    """Unverified on a GPU here: the worker's choices under a mocked CUDA."""
    from tunekit.parallel import worker

    calls = {}
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("set_device", d))
    monkeypatch.setattr(worker.dist, "init_process_group",
                        lambda backend, **kw: calls.update(backend=backend, **kw))
    monkeypatch.setattr(worker.dist, "destroy_process_group", lambda: calls.setdefault("destroyed", True))
    monkeypatch.setattr(worker.dist, "barrier", lambda: calls.setdefault("barrier", True))
    monkeypatch.setattr(worker, "_run", lambda spec, rank, world, nproc, device: (rank, world, nproc, device))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    assert worker.join(spec("ddp")) == (1, 2, 2, torch.device("cuda", 1))
    assert calls["backend"] == "nccl" and calls["device_id"] == torch.device("cuda", 1)
    assert calls["set_device"] == torch.device("cuda", 1) and calls["destroyed"]


def test_run_results_from_before_distributed_fields_still_load():
    from tunekit.core.results import RunResult

    r = RunResult.from_dict({"run_id": 0, "label": "old", "tokens_per_s": 1.0})
    assert (r.world_size, r.parallel, r.comm, r.launch_s) == (None, None, None, None)
    assert math.isnan(r.step_s)


def _llama():
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return AutoModelForCausalLM.from_config(cfg)


def test_a_transformers_model_travels_as_its_config():
    pytest.importorskip("transformers")
    model = _llama()
    s = model_spec(model)
    assert s["kind"] == "transformers" and s["model_type"] == "llama"
    rebuilt = build_model(json.loads(json.dumps(s)))   # what a worker reads from SPEC.json
    assert type(rebuilt) is type(model)
    assert [(n, p.shape) for n, p in rebuilt.named_parameters()] == \
        [(n, p.shape) for n, p in model.named_parameters()]


@pytest.mark.slow
def test_fsdp_on_a_transformers_model_in_bf16_with_checkpointing():
    pytest.importorskip("transformers")
    r = launch({"model": model_spec(_llama()), "parallel": "fsdp", "steps": 1, "warmup": 1,
                "toggles": {"micro_batch": 2, "seq_len": 32, "checkpointing": True, "precision": "bf16"},
                "peak_tflops": 1.0}, nproc=2)
    # bf16 gathers (MixedPrecisionPolicy param_dtype), fp32 reduce-scatters: 2 passes x 2 B =
    # 1 pass x 4 B, so both kinds carry the same bytes
    assert r.comm["per_step"] == r.comm["expected"]
    assert r.comm["per_step"]["all_gather/intra"]["bytes"] == r.comm["per_step"]["reduce_scatter/intra"]["bytes"]
    assert all(math.isfinite(v) for v in r.losses) and r.autocast_dtype == "bfloat16"


@pytest.mark.slow
def test_real_emulated_nodes_carry_only_the_shard_all_reduce_for_hsdp():
    """Through tunekit.parallel.netns (network namespaces joined by a 50 Mbit/s link); skipped where
    it cannot run (no root or no iproute2), with its reason."""
    netns = pytest.importorskip("tunekit.parallel.netns")
    why = netns.check()
    if why is not None:
        pytest.skip(why)
    r = launch(spec("hsdp"), nproc=1, nodes=2, link={"bandwidth": "50mbit", "latency": "1ms"})
    assert r.losses == pytest.approx(single_process_losses(2, WARMUP + STEPS), abs=1e-5)
    assert r.comm["per_step"] == {"all_reduce/inter": {"count": 3, "bytes": 459_776}}
    assert leftover_children() == []


def test_a_rank_dying_in_teardown_after_the_result_is_a_note_not_a_failure(tmp_path):
    """gloo has aborted a rank at its exit ("terminate called without an active exception")
    after rank 0 had gathered every rank's figures: the run is kept, the death noted."""
    from types import SimpleNamespace

    (tmp_path / "result.json").write_text(json.dumps({"notes": ["ok"]}))
    log = tmp_path / "logs" / "run" / "attempt_0" / "1"
    log.mkdir(parents=True)
    (log / "stderr.log").write_text("terminate called without an active exception\n")
    dead = SimpleNamespace(local_rank=1, exitcode=-6, error_file_data={"message": "<NONE>"}, timestamp=1)
    err = launch_mod._failure({1: dead}, tmp_path / "logs")
    assert err.rank == 1 and "exit code -6" in err.traceback and "terminate called" in err.traceback
    launch_mod._note_result(tmp_path, "rank 1 died after the run")
    assert json.loads((tmp_path / "result.json").read_text())["notes"] == ["ok", "rank 1 died after the run"]


def test_the_agents_log_lines_stay_off_the_callers_stderr(tmp_path):
    # in a kernel (no logging handlers set up) the elastic agent's records ("failed (exitcode: 1)")
    # reach stderr through logging's last resort, and a notebook shows them as an error box even
    # where the run is kept; the error (or the run's notes) already says what happened
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from tunekit.parallel.launch import DistRunError, launch
        from tunekit.models.spec import factory_spec
        spec = {{"model": factory_spec("tests.parallel.dist_factories:fails_on_rank_1"), "parallel": "ddp", "steps": 1,
                 "warmup": 0, "toggles": {{"micro_batch": 2, "seq_len": 32}}, "peak_tflops": 1.0}}
        try:
            launch(spec, nproc=2)
        except DistRunError as e:
            print("rank", e.rank)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "rank 1" and done.stderr == ""
