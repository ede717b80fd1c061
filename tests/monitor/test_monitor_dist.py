"""tunekit.Monitor under torchrun: two gloo ranks train a DDP model, each measures its own steps,
and rank 0's summary gathers them at close (no collective inside a timed step)."""
import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch, torch.distributed as dist
    import tunekit
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(tunekit.GPT(tunekit.GPTConfig(vocab_size=256, n_layer=1, n_head=2, n_embd=32, block_size=16)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = [torch.randint(0, 256, (2, 2 + rank, 16)) for _ in range(5)]   # rank 1: 3 samples a step
    mon = tunekit.Monitor(model, live=False, peak=1.0)
    for x, y in mon.iter(batches):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    rec = mon.close()
    out = dict(tokens=[r["tokens"] for r in mon.rows], ranks=None if mon.ranks is None else
               dict(world=mon.ranks.world, rate=mon.ranks.tokens_per_s, n_mfu=len(mon.ranks.mfu)),
               notes=rec.notes)
    json.dump(out, open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w"))
    # Both ranks have written what the test reads; leave without torch's teardown. gloo's group
    # aborted at exit now and then ("terminate called without an active exception", SIGABRT in
    # rank 0), after a barrier, with DDP dropped and the group destroyed too: a torch teardown
    # race outside what this test checks (seen in two sessions, on busy machines).
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)
''')


def test_two_ranks_under_torchrun_gather_at_close(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1))
    assert r0["tokens"] == [2 * 16] * 5 and r1["tokens"] == [3 * 16] * 5   # each rank its own B x S
    assert r0["ranks"]["world"] == 2 and r0["ranks"]["n_mfu"] == 2
    assert r0["ranks"]["rate"] > 0
    assert any(n.startswith("2 ranks: ") and "outside the steps" in n for n in r0["notes"])
