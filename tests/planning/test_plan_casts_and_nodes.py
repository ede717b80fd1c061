"""Two corrections to a plan across ranks (issue 39, item 7): the weight casts a phase's peak holds
(autocast's cache keeps a copy of every weight it cast until the forward ends, checkpointed or not:
under FSDP the gathered half-precision parameters replace them, so a rank holds none), and a
collective across nodes at the node's NICs together (one NCCL ring per NIC), not at one NIC's."""
import pytest
import torch

import tunekit
from tunekit.models.adapters import adapt
from tunekit.planning.shard import comm_seconds, inter_node_gbs, node_net, rank_peak
from tunekit.planning.step import _timeline


def test_the_forwards_peak_holds_autocasts_copy_of_every_weight_even_checkpointed():
    cfg = tunekit.GPTConfig.preset("cpu-tiny")     # 2 layers of 128: qkv 128x384, proj 128x128, fc 128x512, 512x128
    p = tunekit.plan(cfg, "cpu", precision="bf16", micro_batch=2, seq_len=32, checkpointing=True)
    torch.manual_seed(0)
    model = tunekit.GPT(cfg)
    x, y = torch.randint(0, 256, (2, 2, 32))
    step = _timeline(model, adapt(model), "gpt", (x, y), p.setting, 1)
    # bf16 copies of 2 x (49,152 + 16,384 + 65,536 + 65,536) = 393,216 block weights and the 256 x 128 = 32,768
    # lm_head: 2 B x 425,984 = 851,968 B alive at the loss; none at the optimizer's step
    assert step["casts_at"]["forward"] == 851968
    assert step["casts_at"]["optimizer step"] == 0


def test_a_ranks_forward_peak_swaps_the_casts_alive_there_for_the_gathered_blocks():
    units = [[(4, 5)], [(4, 5)], [(4, 5)]]      # two blocks and the root, 20 elements each, over 2 ranks: half
    comps = {"weights": 240.0, "weight_casts": 10.0}   # 60 fp32 elements; 10 B of casts kept for backward
    # gathered in bf16: the two blocks 2 x 40 B and the root's 40 B = 120 B; the weights lose half (120 B)
    _, kept = rank_peak(1000.0, comps, 0.0, units, "fsdp", 2, 1, 2, phase="forward")
    assert kept == 1000 - 120 + 120 - 10
    # where the forward's peak holds autocast's whole cache (60 elements x 2 B = 120 B), all of it goes
    _, cached = rank_peak(1000.0, comps, 0.0, units, "fsdp", 2, 1, 2, phase="forward", casts_at_peak=120.0)
    assert cached == 1000 - 120 + 120 - 120


def test_a_collective_across_nodes_runs_at_the_nodes_nics_together_capped_by_nvlink():
    h100, a100 = node_net("H100 SXM"), node_net("A100 40GB")
    assert h100[:2] == (8, 47.0) and a100[:2] == (8, 24.0) and node_net("L4")[:2] == (1, 47.0)
    assert inter_node_gbs(h100, 450, 8) == 8 * 47.0          # 376 GB/s under NVLink's 450
    assert inter_node_gbs(h100, 300, 8) == 300               # NVLink the lower
    assert inter_node_gbs(a100, 300, 8, groups_per_node=8) == 24.0   # HSDP: 8 replica groups, one NIC each
    units = [[(16, 2)], [(16, 2)]]             # 64 elements, nothing padded over 16 ranks
    _, parts = comm_seconds("fsdp", units, world=16, nodes=2, gathered_bytes=2, link_gbs=450.0, net=h100)
    # all-gathers 2 x 64 x 2 B = 256 B and a reduce-scatter of 64 x 4 B = 256 B, each 15/16 of it at 376 GB/s
    assert parts == pytest.approx({"all_gather/inter": 256 * 15 / 16 / 376e9,
                                   "reduce_scatter/inter": 256 * 15 / 16 / 376e9})
