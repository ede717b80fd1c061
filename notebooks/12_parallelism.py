# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 12 · Parallelism: memory per GPU, the pipeline bubble, all-reduce bandwidth
#
# **Claim.** Plain data parallelism (DDP) keeps a full copy of weights, gradients and optimizer
# states on every GPU. ZeRO shards them over the `N` data-parallel ranks — stage 1 the optimizer
# states, stage 2 also the gradients, stage 3 (FSDP `FULL_SHARD`) also the weights — at the price of
# more communication: stage 3 all-gathers the weights in forward and backward. On a slow inter-node
# link that traffic dominates, which is why the documents' case study went from 1,500 tokens/s
# (FULL_SHARD over 2 nodes, 50 Gbps) to 24,000 (HYBRID_SHARD: shard inside a node, replicate across
# nodes). Pipeline parallelism idles `(p−1)/(m+p−1)` of the time with `p` stages and `m`
# micro-batches.

# %%
import math
import torch
import plotly.graph_objects as go
import pandas as pd
import tunekit
from tunekit import bench
from tunekit.core import formulas as F
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
GPU = torch.cuda.is_available()
device = "cuda" if GPU else "cpu"
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")
GB = 1e9

# %% [markdown]
# ## 1. Static memory per GPU: DDP vs ZeRO stages
#
# A 7B model in mixed precision with AdamW (18 B/param) on 8 GPUs:

# %%
n, dp = 7e9, 8
stages = {s: tunekit.estimate_memory(n, zero_stage=s, dp=dp, layout='mixed', optimizer='adamw') for s in range(4)}
lines = ['weights', 'master_weights', 'gradients', 'optimizer_states']
mem = pd.DataFrame({f'ZeRO-{s}' if s else 'DDP': {k: e[k] / GB for k in lines} for s, e in stages.items()}).T
mem['total GB'] = mem.sum(axis=1)
assert round(mem.loc['DDP', 'total GB']) == 126                      # 7e9 x 18 B
assert abs(mem.loc['ZeRO-3', 'total GB'] - 126 / 8) < 1e-6            # everything sharded 8 ways
assert abs(mem.loc['ZeRO-1', 'total GB'] - 7 * (2 + 4 / 8 + 4 + 8 / 8)) < 1e-6   # master copy and AdamW moments sharded: 52.5 GB
fig = go.Figure([go.Bar(name=k, x=mem.index, y=mem[k]) for k in lines])
fig.add_hline(y=80, line_dash='dot', annotation_text='80 GB GPU')
fig.update_layout(barmode='stack', title=f'7B, mixed precision + AdamW, {dp} GPUs: static GB per GPU (activations extra)',
                  yaxis_title='GB (1e9 bytes)')
display(mem.round(2)); fig

# %% [markdown]
# How tunekit's estimate shards the lines: stage 1 divides the optimizer states and the fp32 master
# copy by `N` (ZeRO counts the master copy as optimizer state) — check the table against that rule
# before you quote it.

# %%
fits = [k for k in mem.index if mem.loc[k, 'total GB'] < 80]
print(f'DDP needs {mem.loc["DDP", "total GB"]:.0f} GB per GPU before activations: it cannot hold a 7B model on 80 GB GPUs.')
print(f'fits in 80 GB with room for activations: {fits}; ZeRO-3 leaves {80 - mem.loc["ZeRO-3", "total GB"]:.0f} GB free per GPU.')


# %% [markdown]
# ## 2. The pipeline bubble
#
# With `p` stages, the first micro-batch takes `p` steps to reach the last stage and the last one
# `p` steps to drain: `(p−1)` idle slots per stage out of `m + p − 1`.

# %%
def bubble(p, m):
    return (p - 1) / (m + p - 1)
assert bubble(4, 4) == 3 / 7 and bubble(1, 8) == 0
ms = [1, 2, 4, 8, 16, 32, 64]
fig = go.Figure([go.Scatter(x=ms, y=[bubble(p, m) * 100 for m in ms], name=f'p = {p} stages') for p in (2, 4, 8)])
fig.update_layout(title='pipeline bubble vs micro-batches per step', xaxis_title='micro-batches m (= GAS)',
                  yaxis_title='idle %', xaxis_type='log')
fig

# %%
need = {p: next(m for m in range(1, 10_000) if bubble(p, m) <= 0.05) for p in (2, 4, 8)}
print('micro-batches per step for a bubble under 5%:', need, '-> m = 19(p-1): hence the large gradient accumulation that pipeline parallelism needs')
assert need == {2: 19, 4: 57, 8: 133}   # (p-1)/(m+p-1) <= 0.05  <=>  m >= 19(p-1)

# %% [markdown]
# ## 3. All-reduce bandwidth, measured
#
# `bench.all_reduce_busbw` launches real ranks (NCCL on GPUs, gloo processes on CPU) with the launcher
# that `lab.run(parallel=...)` uses in section 5 (torch.distributed's elastic agent) and reports the
# nccl-tests figures: algbw = bytes / time and busbw = algbw · 2(n−1)/n, the traffic per link of a
# ring, comparable across rank counts.

# %%
assert F.allreduce_busbw(100, 8) == 175          # 100 * 2*7/8
assert F.allreduce_busbw(100, 2) == 100
sizes = (2**12, 2**16, 2**20, 2**22) if not GPU else (2**20, 2**24, 2**27)
ar = bench.all_reduce_busbw(world_size=2, sizes_bytes=sizes)
print('backend:', ar.attrs.get('backend'), '| notes:', ar.attrs.get('notes'))
display(ar[['size_bytes', 'median_s', 'algbw_gb_per_s', 'busbw_gb_per_s', 'busbw_gbit_per_s']])
bench.plot(ar)

# %%
big = ar.iloc[-1]
if math.isnan(big.busbw_gb_per_s):
    print('the all-reduce did not run here:', ar.attrs.get('notes'))
else:
    small = ar.iloc[0]
    lat_bound = small.busbw_gbit_per_s < big.busbw_gbit_per_s / 2   # a fixed cost per call dominates small ones
    print(f'{int(small.size_bytes):,} B: {small.busbw_gbit_per_s:.2f} Gbit/s; {int(big.size_bytes):,} B: {big.busbw_gbit_per_s:.2f} Gbit/s '
          + (f'-> small messages are latency-bound here ({small.median_s * 1e6:.0f} us each), which is why frameworks bucket gradients.'
             if lat_bound else '-> small messages reached at least half the large ones\' bandwidth here; each call still pays a '
             'fixed latency, which is why frameworks bucket gradients.'))
    where = ('two GPUs over NVLink/PCIe (NCCL)' if ar.attrs.get('backend') == 'nccl' else
             'two CPU processes over the loopback interface (gloo)')
    print(f'the documents recommend at least 400 Gbit/s between nodes; BLOOM trained on 50. Here, {where} '
          f'reach {big.busbw_gbit_per_s:.1f} Gbit/s.')
    assert big.busbw_gb_per_s > 0

# %% [markdown]
# ## 4. Why HYBRID_SHARD beats FULL_SHARD on slow links
#
# A traffic model for the case study (7B, bf16 weights and gradients = 14 GB, 2 nodes × 4 GPUs, 50
# Gbit/s between nodes): count the bytes that must cross the inter-node link per optimizer step.
# FULL_SHARD over all 8 ranks runs its all-gathers (forward, backward) and its reduce-scatter
# (gradients) over a ring that crosses the slow link; HYBRID_SHARD keeps those inside each node and
# sends only the gradient all-reduce of each GPU's shard across. This ignores overlap with compute
# and latency; it is the shape of the argument, not a simulation.

# %%
S, n_all, per_node, link_GBps = 14e9, 8, 4, 50 / 8   # bytes; ranks; GPUs per node; 50 Gbit/s = 6.25 GB/s
full = 3 * (n_all - 1) / n_all * S                       # 2 all-gathers + 1 reduce-scatter over the 8-rank ring
hybrid = per_node * F.allreduce_busbw(S / per_node, 2)   # 4 shard all-reduces between the 2 nodes
t_full, t_hybrid = full / 1e9 / link_GBps, hybrid / 1e9 / link_GBps
fig = go.Figure(go.Bar(x=['FULL_SHARD (8 ranks)', 'HYBRID_SHARD (4 x 2)'], y=[t_full, t_hybrid],
                       text=[f'{full / 1e9:.1f} GB', f'{hybrid / 1e9:.1f} GB']))
fig.update_layout(title='inter-node traffic per step at 50 Gbit/s (model)', yaxis_title='seconds on the slow link')
assert abs(full / 1e9 - 36.75) < 1e-9 and abs(hybrid / 1e9 - 14) < 1e-9
fig

# %%
print(f'FULL_SHARD pushes {full / 1e9:.2f} GB per step across the nodes ({t_full:.1f} s at 50 Gbit/s); HYBRID_SHARD {hybrid / 1e9:.1f} GB '
      f'({t_hybrid:.1f} s): {full / hybrid:.1f}x less, and only once per step, late in backward, where it overlaps compute.')
print('The case study (published): 1,500 tok/s FULL_SHARD on 2 nodes -> 8,000 on one node with checkpointing -> 16,000 with '
      'FlashAttention-2 -> 24,000 with HYBRID_SHARD on 2 nodes: the slow link stopped being on the critical path.')

# %% [markdown]
# ## 5. DDP vs SHARD_GRAD_OP vs FULL_SHARD, measured on two CPU ranks
#
# The tables above are models. `lab.run(parallel=..., nproc=2)` starts two real ranks (gloo
# processes under torch.distributed's elastic agent, the launcher torchrun uses) on the built-in
# tiny GPT and measures on each rank what it holds — its local parameters, gradients and AdamW
# state — and every collective of one optimizer step, by kind. Next to them: `estimate_memory`'s
# prediction for that sharding, and the bytes that `tunekit.core.comm.expected_comm` derives from
# the parameter shapes alone (FULL_SHARD: each unit all-gathered in forward and again in backward,
# its gradients reduce-scattered; SHARD_GRAD_OP: no second all-gather; DDP: one all-reduce of
# every gradient, plus a broadcast of the buffers).

# %%
from tunekit.core.comm import expected_comm, total_by
from tunekit.models.adapters import adapt
lab = tunekit.Lab()                 # the built-in tiny GPT (2 layers, n_embd 128), fp32 + AdamW
kinds = ['ddp', 'fsdp_grad_op', 'fsdp']
# warmup=3: the collectives are counted on the last warm-up step, past DDP's second one (which also
# broadcasts its rebuilt bucket order once, a few bytes)
dist = {p: lab.run(parallel=p, nproc=2, steps=2, warmup=3, precision='fp32', optimizer='adamw') for p in kinds}


def unit_shapes(model, parallel):
    """fully_shard units: each block, then what the root holds itself (a tied weight once); DDP: one."""
    seen, units = set(), []
    groups = [list(b.parameters()) for b in adapt(model).blocks()] if parallel != 'ddp' else []
    for params in groups + [list(model.parameters())]:
        units.append([tuple(q.shape) for q in params if id(q) not in seen and not seen.add(id(q))])
    return units


buffers = sum(b.numel() * b.element_size() for b in lab.model.buffers())
rows = []
for p, r in dist.items():
    est = tunekit.estimate_memory(lab.config, precision='fp32', optimizer='adamw', device='cpu',
                                  parallel=p, world_size=2)
    formula = total_by(expected_comm(p, unit_shapes(lab.model, p), world=2,
                                     buffer_bytes=buffers if p == 'ddp' else 0), 'kind')
    measured = r.comm['by_kind']
    row = {'parallel': p, 'measured MiB/rank': (r.params_bytes + r.grads_bytes + r.optimizer_bytes) / 2**20,
           'estimate MiB/rank': est.static_bytes / 2**20, 'peak RSS MiB (max rank)': max(r.peak_mem_bytes_per_rank) / 2**20}
    for k in ('all_gather', 'reduce_scatter', 'all_reduce', 'broadcast'):
        row[f'{k} MB'] = measured.get(k, {}).get('bytes', 0) / 1e6
        row[f'{k} MB (formula)'] = formula.get(k, {}).get('bytes', 0) / 1e6
    row.update({'tokens/s': r.tokens_per_s, 'launch to first step s': r.launch_s})
    rows.append(row)
    assert {k: v['bytes'] for k, v in measured.items()} == {k: v['bytes'] for k, v in formula.items()}, p
    assert abs(row['measured MiB/rank'] / row['estimate MiB/rank'] - 1) < 0.10, p
meas = pd.DataFrame(rows).set_index('parallel')
display(meas.round(3).T)

# %%
from plotly.subplots import make_subplots
fig = make_subplots(rows=1, cols=2, subplot_titles=['params + grads + AdamW state per rank (MiB)',
                                                    'bytes per optimizer step by collective (MB)'])
fig.add_bar(x=kinds, y=meas['measured MiB/rank'], name='measured on the ranks', row=1, col=1)
fig.add_bar(x=kinds, y=meas['estimate MiB/rank'], name='estimate_memory', row=1, col=1)
for k in ('all_gather', 'reduce_scatter', 'all_reduce', 'broadcast'):
    fig.add_bar(x=kinds, y=meas[f'{k} MB'], name=f'{k} (measured)', row=1, col=2)
    fig.add_scatter(x=kinds, y=meas[f'{k} MB (formula)'], mode='markers', marker_symbol='x', marker_size=10,
                    name=f'{k} (formula)', row=1, col=2)
fig.update_layout(title='two gloo ranks, tiny GPT, fp32 + AdamW: measured vs predicted', barmode='group', height=450)
fig

# %%
ddp, op, full = (meas.loc[k] for k in kinds)
traffic = {k: sum(meas.loc[k, f'{c} MB'] for c in ('all_gather', 'reduce_scatter', 'all_reduce', 'broadcast')) for k in kinds}
print(f"memory per rank: DDP {ddp['measured MiB/rank']:.2f} MiB -> sharded over 2 ranks "
      f"{full['measured MiB/rank']:.2f} MiB ({full['measured MiB/rank'] / ddp['measured MiB/rank']:.0%} of DDP); "
      f"estimate_memory is within {max(abs(meas['measured MiB/rank'] / meas['estimate MiB/rank'] - 1)):.1%} of every one.")
print(f"bytes per step equal the formulas exactly: DDP {traffic['ddp']:.2f} MB (the gradients' all-reduce + the buffers' broadcast), "
      f"SHARD_GRAD_OP {traffic['fsdp_grad_op']:.2f} MB (one all-gather + one reduce-scatter), "
      f"FULL_SHARD {traffic['fsdp']:.2f} MB (the extra backward all-gather: {traffic['fsdp'] / traffic['ddp']:.1f}x DDP's volume).")
rss_share = ddp['measured MiB/rank'] / meas['peak RSS MiB (max rank)'].min()
print(f"the peak RSS of a rank ({meas['peak RSS MiB (max rank)'].min():.0f}-{meas['peak RSS MiB (max rank)'].max():.0f} MiB) includes "
      f"the interpreter and torch itself; DDP's full static bytes are {rss_share:.1%} of the smallest"
      + (', a rounding error at this size' if rss_share < 0.05 else '') + '; at 7B they are the 126 GB of section 1.')
print('launch to first step (start the interpreters, rendezvous, build and shard the model): '
      + ', '.join(f'{k} {meas.loc[k, "launch to first step s"]:.1f} s' for k in kinds)
      + ' -- a fixed cost per job, paid again at every restart.')
assert full['measured MiB/rank'] < ddp['measured MiB/rank'] and traffic['fsdp'] > traffic['fsdp_grad_op']
# tokens/s on 2 shared cores is not a verdict on DDP vs FSDP: both ranks share the same two cores and the
# collectives run over loopback; chapter 13 measures the sharding rungs over an emulated slow link.

# %% [markdown]
# ## Conclusion and exercise
#
# * Sharding divides static memory by the data-parallel size; what you pay is communication volume,
#   and where that volume flows (fast NVLink inside a node or a slow NIC between nodes) decides the
#   speed.
# * Pipeline parallelism needs many micro-batches per step to hide its bubble.
# * Measure your links' busbw before choosing: the same plan can be compute-bound on one cluster and
#   network-bound on another.
#
# **Exercise:** redo section 4 for 4 nodes × 8 GPUs at 400 Gbit/s. Is FULL_SHARD still the
# bottleneck?
