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
# # 04 · Batch sizes and gradient accumulation
#
# **Claim.** The global batch (samples per optimizer step) is `GBS = MBS · DP · GAS`: micro-batch
# per device × data-parallel replicas × gradient-accumulation steps, with `DP = N_GPUs / (TP · PP)`.
# Make the micro-batch as large as memory allows (bigger matmuls run closer to peak), then reach the
# GBS you want with accumulation: same math per optimizer step, less memory, fewer optimizer steps
# and fewer gradient all-reduces.

# %%
import math
import torch
import pandas as pd
import tunekit
from tunekit.core import formulas as F
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
GPU = torch.cuda.is_available()
device = "cuda" if GPU else "cpu"
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")

# %% [markdown]
# ## 1. The arithmetic, with the documents' examples

# %%
assert F.global_batch_size(micro_batch=4, dp=8) == 32                 # 8 GPUs, MBS 4
dp = F.data_parallel_size(8, tp=2, pp=2)
assert dp == 2 and F.global_batch_size(4, dp) == 8                     # TP=2, PP=2 -> 2 replicas
assert F.global_batch_size(4, dp=F.data_parallel_size(8), grad_accum=4) == 128
try:
    F.data_parallel_size(8, tp=3)
except ValueError as e:
    print('refused:', e)

# %% [markdown]
# ## 2. Same global batch, different splits
#
# We train the live model with a fixed GBS of 8 sequences split four ways: MBS 1 × GAS 8 … MBS 8 ×
# GAS 1. The work per optimizer step is identical; only the shape of the matmuls, the number of
# kernel launches and the activation memory change. Runs alternate and repeat, and we read the
# *fastest* step of each: on shared cores, contention only ever adds time, so the minimum is the
# most repeatable estimate.

# %%
lab = tunekit.Lab(preset='gpt2-124m' if GPU else 'cpu-tiny')
GBS, seq = 8, (512 if GPU else 128)
splits = [(1, 8), (2, 4), (4, 2), (8, 1)]
lab.run(steps=1, warmup=1, micro_batch=2, grad_accum=1, seq_len=seq)   # warm caches, calibrate peak

# %% [markdown]
# ### Predict, then measure
#
# One optimizer step of 8 sequences, as 2 sequences × 4 accumulation steps, or as 8 × 1: the same
# FLOPs, in bigger matmuls and fewer calls. How long will the 8 × 1 step take against the 2 × 4 one?
# Write your guess as a ratio (1.0: the same; 0.5: half the time; '-30%' or '0.7x' are read too).

# %%
my_guess = 0.7   # your guess: step time of MBS 8 x GAS 1 / MBS 2 x GAS 4 (edit it, then run on)
my_guess = tunekit.lab.guess.as_ratio(my_guess)   # read now: a badly typed guess is refused here
print(f"your guess: {my_guess:g}x")

# %%
base0 = lab.run(steps=3, warmup=1, micro_batch=2, grad_accum=4, seq_len=seq, trace=True)
expected = lab.expect(micro_batch=8, grad_accum=1, seq_len=seq)   # before the 8 x 1 run is measured
print(expected.line)
run0 = lab.run(steps=3, warmup=1, micro_batch=8, grad_accum=1, seq_len=seq)
check = tunekit.lab.check_guess(my_guess, expected, run0, base0, what='step time, MBS 8 x GAS 1 / MBS 2 x GAS 4')
print(check)
check.figure()

# %% [markdown]
# The expectation resized every op of the step from the base run's measured time per op; what it
# cannot foresee (the cores busy with something else, a cache that a bigger batch no longer fits)
# shows in the gap. Now the four splits, alternated and repeated:

# %%
runs = {s: [] for s in splits}
for _ in range(2):
    for mb, ga in splits:
        runs[(mb, ga)].append(lab.run(steps=3, warmup=1, micro_batch=mb, grad_accum=ga, seq_len=seq))
rows = []
for (mb, ga), rs in runs.items():
    rows.append(dict(micro_batch=mb, grad_accum=ga, gbs=mb * ga,
                     tokens_per_s=rs[0].tokens_per_step / min(r.step_s_min for r in rs),   # best step of 6
                     saved_MiB=rs[-1].saved_bytes / 2**20,
                     static_MiB=(rs[-1].params_bytes + rs[-1].grads_bytes + rs[-1].optimizer_bytes) / 2**20))
print(tunekit.lab.repeat_agreement(runs.values())[1])
df = pd.DataFrame(rows)
assert (df.gbs == GBS).all() and (df.tokens_per_s > 0).all()
df.round(2)

# %%
from plotly.subplots import make_subplots
fig = make_subplots(specs=[[{'secondary_y': True}]])
labels = [f'MBS {m} x GAS {g}' for m, g in splits]
fig.add_bar(x=labels, y=df.tokens_per_s, name='tokens/s (best step)')
fig.add_scatter(x=labels, y=df.saved_MiB, name='activations saved per micro-batch (MiB)', secondary_y=True, mode='lines+markers')
fig.update_layout(title=f'GBS {GBS} at seq {seq}: throughput and activation memory')
fig.update_yaxes(title_text='tokens/s', secondary_y=False)
fig.update_yaxes(title_text='MiB (2^20 bytes)', secondary_y=True)
fig

# %%
speedup = df.tokens_per_s.iloc[-1] / df.tokens_per_s.iloc[0]
mem_ratio = df.saved_MiB.iloc[-1] / df.saved_MiB.iloc[0]
print(f'MBS 8 x GAS 1 runs at {speedup:.2f}x the tokens/s of MBS 1 x GAS 8 and holds {mem_ratio:.1f}x the activations per micro-batch.')
# judged on the repeats (each run's fastest step per token), not on one best number
bigger = tunekit.verdict(runs[splits[0]], runs[splits[-1]])
print(f'{labels[-1]} against {labels[0]}: ' + bigger.conclusion(
    helped='the bigger micro-batch is faster per token on this machine.',
    within_noise='no difference this machine can show at this size (the paragraph below says why it can be small).',
    hurt='the bigger micro-batch is slower per token here; on a CPU its larger activations can fall out '
         'of the caches.'))
print(f'Static memory (weights+grads+AdamW) is {df.static_MiB.iloc[0]:.1f} MiB in every split: accumulation does not touch it.')
assert df.saved_MiB.iloc[-1] > df.saved_MiB.iloc[0]

# %% [markdown]
# Why the split can matter: a micro-batch of 1 gives a GPU matmuls too small to occupy its many
# cores, so throughput rises with the micro-batch until they are large enough. A few CPU cores are
# filled by much smaller matmuls, so there a bigger micro-batch mostly saves Python and kernel
# launches per sample. The memory side of the trade is exact on both. With data parallelism, GAS
# also divides the number of gradient all-reduces (each moving ~2× the gradient bytes) — chapter 12
# measures that cost.

# %% [markdown]
# ## 3. The largest micro-batch that fits
#
# `lab.find_max_batch_size` grows the micro-batch until a step runs out of memory (on CPU: exceeds a
# budget), then bisects, so the answer need not be a power of 2. The global batch must still come
# out exact: pick a micro-batch that divides it.

# %%
budget = None if GPU else 96 * 2**20   # CPU: allow 96 MiB above the baseline
best = lab.find_max_batch_size(memory_budget_bytes=budget, limit=64, seq_len=seq)
print(best)
assert best.best is not None and best.best >= 1
mbs64 = max(d for d in range(1, min(best.best, 64) + 1) if 64 % d == 0)   # GBS = MBS x GAS must come out exact
print(f'largest micro-batch: {best.best}. For GBS 64 on one device: MBS {mbs64} x GAS {64 // mbs64}'
      + ('' if mbs64 == best.best else f' (MBS {best.best} x GAS {math.ceil(64 / best.best)} would give GBS {best.best * math.ceil(64 / best.best)}, not 64)'))

# %% [markdown]
# ## Conclusion and exercise
#
# * `GBS = MBS · DP · GAS` fixes the optimization; how you split it is a performance choice.
# * Bigger micro-batches cost activation memory linearly and buy throughput until the device is
#   saturated.
# * Accumulation keeps the GBS when memory runs out, and in data parallelism cuts communication.
#
# **Exercise:** open `lab.dashboard()` (chapter 01) and find the smallest micro-batch that reaches
# 90% of the best tokens/s on your machine.
