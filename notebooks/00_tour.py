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
# # tunekit tour
#
# Profile a real training step cell by cell, then flip optimizations on the same live model from a
# dashboard. Everything here is sized to run on a laptop CPU in under a minute; on a GPU the same
# cells report GPU memory, NVML and spec-sheet MFU.

# %%
import torch
import tunekit
# %load_ext tunekit

lab = tunekit.Lab()          # the built-in byte-level GPT, preset 'cpu-tiny'
model = lab.model
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
print(model.config)
print(f'{model.num_params():,} non-embedding parameters')

# %% [markdown]
# ## 1. Profile a training step
#
# `%%gpuprofile` measures wall time, CPU and GPU memory and counts FLOPs. Counting slows the run it
# counts, so the **first** run of a cell reports FLOPs but no TFLOPS; a re-run reuses the count and
# reports TFLOPS, MFU and HFU from a clean clock.

# %%
batch_size, seq_len = 8, 128
x, y = lab.batch(batch_size, seq_len)

def train_step():
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()

print(f'warm-up step, loss {train_step():.3f}')  # the first step allocates optimizer state and picks kernels

# %%
# %%gpuprofile -n train_step
for _ in range(3):
    loss = train_step()

# %%
# %%gpuprofile -n train_step
for _ in range(3):
    loss = train_step()

# %% [markdown]
# The second run says `cached`: same cell, same input shapes. Double the batch in another cell and
# the count is redone (FLOPs double) instead of silently reusing a stale number:

# %%
batch_size = 16
x, y = lab.batch(batch_size, seq_len)

# %%
# %%gpuprofile -n train_step
for _ in range(3):
    loss = train_step()

# %%
h = tunekit.history()
assert h.flops.iloc[-1] == 2 * h.flops.iloc[-2]   # the recount saw the bigger batch
h   # the columns read first, formatted; h holds them as raw numbers, tunekit.history(all=True) every column

# %%
tunekit.profiling.plot_history()

# %% [markdown]
# On CPU the peak behind MFU is a **measured** one: the best matmul TFLOPS this machine reached
# (`tunekit.calibrate`). On a known GPU it is the dense spec-sheet figure:

# %%
print('H100 SXM bf16 peak:', tunekit.peak_tflops('NVIDIA H100 80GB HBM3', 'bf16'), 'TFLOPS')
print('this machine:', tunekit.history(all=True).peak_tflops_source.dropna().iloc[-1])

# %% [markdown]
# ## 2. Flip optimizations on the live model
#
# `lab.run(**toggles)` applies toggles to the same model and measures steady-state steps (warm-up
# excluded, FLOPs counted on a separate step). The dashboard below drives the same lab: change a
# control, press **Run**.

# %%
base = lab.run(steps=4, warmup=1)
ckpt = lab.run(steps=4, warmup=1, checkpointing=True)
bf16 = lab.run(steps=4, warmup=1, precision='bf16')
lab.results()

# %%
lab.compare()

# %% [markdown]
# Checkpointing recomputes activations in the backward pass: HFU counts that extra work, MFU does
# not, so with checkpointing on HFU > MFU. Saved activation memory is what it buys:

# %%
print(f'saved activations: {base.saved_bytes/2**20:.1f} MiB -> {ckpt.saved_bytes/2**20:.1f} MiB with checkpointing')
print(f'HFU/MFU with checkpointing: {ckpt.hfu/ckpt.mfu:.2f}')
assert ckpt.saved_bytes < base.saved_bytes

# %% [markdown]
# Is checkpointing slower? One run of each is one sample, and other work on the machine can slow any
# run. `tunekit.verdict` compares repeated runs against their noise and prints the machine's
# condition beside its conclusion: runs measured while the machine was busy are set aside, and with
# too few quiet ones it says the result is uncertain instead of drawing it.

# %%
again = [lab.run(steps=4, warmup=1), lab.run(steps=4, warmup=1, checkpointing=True)]
speed = tunekit.verdict([base, again[0]], [ckpt, again[1]])   # each run is one repeat
print('checkpointing, speed: ' + speed.conclusion(
    hurt='recomputing activations in backward costs time; it pays only through the bigger batch the '
         'freed memory allows (chapter 05).',
    within_noise='the recomputation is too small a share of this step to show above the noise.',
    helped='faster here, which recomputation alone cannot explain: rerun to see whether it repeats.'))

# %%
lab.dashboard()

# %% [markdown]
# ## 3. Everything on one page
#
# The summary of this session: where it ran, the peak MFU is measured against, every profiled cell
# and every run. `make tour` turns this notebook into a report that opens offline, with this summary
# on top.

# %%
tunekit.cli.show_summary(lab)

