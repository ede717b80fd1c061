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
# # 14 · Why is this step slow? Reading a trace and a memory timeline
#
# **Claim.** Before changing anything, measure where the step spends its time and its memory. The
# documents give the shape to expect: linear layers do 2× the forward's FLOPs in backward and
# usually take about 2× the time; activations (GELU, softmax) and other pointwise ops are
# bandwidth-limited, so they take more time than their FLOPs suggest; AdamW in fp32 keeps
# 4 + 4 + 8 = 16 bytes per parameter (weights, gradients, two moments), and on top of that come
# the activations, which pile up through the forward pass and are freed in backward.
#
# `%%gpuprofile --trace` runs torch.profiler over one run of a cell and splits its time into
# categories (matmul/linear, attention, normalization, activation/elementwise, optimizer,
# communication, memory copies, data loading, other; on a GPU also idle), each op counted once by
# its self time. `--memory` adds a timeline of what is alive, by category.

# %%
import torch
import pandas as pd
import tunekit
from tunekit.core.units import MiB
GPU = torch.cuda.is_available()
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")

# %load_ext tunekit

# %% [markdown]
# The demo GPT and one training step (forward, backward, AdamW), the same one the Lab times. One
# step runs first so the optimizer state exists: every step from here on is a steady one.

# %%
lab = tunekit.Lab(preset='gpt2-124m' if GPU else 'cpu-tiny',
                  micro_batch=(8 if GPU else 4), seq_len=(512 if GPU else 128))
toggles = lab.resolve()
lab.apply(toggles)

def train_step():
    return lab.train_step(toggles)

_ = train_step()

# %% [markdown]
# ## 1. A trace of one step
#
# A trace is only as good as the run it watches. `--trace` traces from a cell's first run on, and
# a traced run counts no FLOPs (the counter's Python dispatch would show up in the trace as if it
# were the work): it reuses the count of an untraced run of the same cell. So here the first run
# counts FLOPs, the second gives the clean time; the third, with `--trace`, is traced, reuses the
# count, and its record says how much the profiler slowed it against that clean run.

# %%
# %%gpuprofile -q -n step
loss = train_step()

# %%
# %%gpuprofile -q -n step
loss = train_step()

# %%
# %%gpuprofile -n step --trace
loss = train_step()

# %% [markdown]
# Above: the record, the time split by category, the top ops by self time, and the Chrome trace
# file (drag it into https://ui.perfetto.dev, or open it in TensorBoard). The numbers behind them:

# %%
rec = tunekit.last()
b = rec.trace
print(f"traced step: {b.wall_s * 1e3:.1f} ms; the categories add up to {b.total_s() / b.wall_s:.0%} of it"
      + (f", the rest is Python between ops ({b.untraced_s * 1e3:.1f} ms)" if not GPU else " (idle included)")
      + (f"; measured on a busy machine ({rec.conditions.reason})" if rec.conditions is not None and rec.conditions.busy else ""))
print(f"profiler overhead against the untraced run: {b.overhead_text()} (one run against one, so their "
      "noise is in it too; the Lab below compares with the median of its timed steps)")
# every op counted once, by its self time. On CPU the ops ran inside the timed step, so their times
# add up to at most its wall time; how much of it they cover is a measurement (a busy machine
# leaves more time between ops), not asserted. On a GPU, kernel time plus idle covers the step.
assert (0 < b.total_s() <= b.wall_s) if not GPU else b.total_s() >= b.wall_s * (1 - 1e-9)
if not GPU:   # each linear layer runs one matmul forward and two backward (input and weight gradients)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in lab.model.modules())
    assert sum(r["calls"] for r in b.top_ops if r["op"] == "aten::mm") == 3 * n_linear
b.frame().round(4)

# %% [markdown]
# One trace is one sample, and on shared cores a burst of load can land on any op. Trace the step
# three more times. Contention only ever adds time, so each category's fastest time over the
# traces is the best estimate of its own cost; then check how often single traces agree. Each
# traced record carries the machine's condition: `tunekit.measure.conclude` prints it beside the
# conclusion, or says the conclusion is uncertain when other work was using the machine meanwhile.

# %%
records = [rec]
for _ in range(3):
    with tunekit.profile(name="again", flops="never", trace=True) as r:
        train_step()
    records.append(r)
traces = [r.trace for r in records]
per_trace = pd.DataFrame([t.seconds for t in traces])
fastest = per_trace.min()
shares = (fastest / fastest.sum()).sort_values(ascending=False)
top = shares.index[0]
held = sum(t.dominant() == top for t in traces)
print("largest category by its fastest time: " + tunekit.measure.conclude(
    f"{top} ({shares[top]:.0%} of the step); largest in {held} of {len(traces)} single traces -> "
    + ("the verdict holds run after run." if held >= len(traces) - 1 else "single traces disagree: trust the fastest times."),
    records))
shares.round(3)

# %%
mm, pw = shares["matmul/linear"], shares["activation/elementwise"] + shares["normalization"]
opt = shares["optimizer"]
said = f"matmuls take {mm:.0%} of the step, pointwise and normalization ops {pw:.0%}, the optimizer {opt:.0%}. "
if GPU:
    said += (f"Idle: {shares['idle']:.0%} of the wall time had no kernel running (launch overhead, "
             "host work): a bigger batch or torch.compile shrinks it. ")
else:
    small_ops = ("At this small width (n_embd=128) a matmul is cheap, while the hand-written RMSNorm, "
                 "the rotary embedding and GELU run many small pointwise ops, each paying a fixed "
                 "dispatch cost (on a GPU: a kernel launch) and reading all of its input from memory. ")
    if top == "matmul/linear":
        said += "On this CPU the matmuls are the largest single category" + (
                ", but the pointwise and normalization ops together take as much or more. " + small_ops
                if pw >= mm else ", ahead of all pointwise work together, as on a GPU at a healthy batch size. ")
    else:
        said += f"On this CPU the matmuls are not the largest category: {top} is. " + small_ops
said += (f"The optimizer ({opt:.0%}) is AdamW touching every parameter several times per step: "
         "memory-bound work that a fused or foreach optimizer batches.")
print("where the step's time goes: " + tunekit.measure.conclude(said, records))

# %% [markdown]
# The top ops name the kernels behind the categories; `aten::mm` covers the forward matmuls *and*
# both backward ones (input and weight gradients), which is where the documents' "backward ≈ 2×
# forward" comes from.

# %%
top_ops = b.table(8)
top_ops.assign(self_ms=(top_ops.self_s * 1e3).round(2)).drop(columns="self_s")

# %% [markdown]
# ## 2. The memory timeline
#
# `--memory` turns on torch.profiler's memory profiler, which follows every tensor and sorts it
# into parameters, gradients, optimizer state, activations (saved for backward) and temporaries.

# %%
# %%gpuprofile -n step --memory
loss = train_step()

# %%
tl = tunekit.last().memory
t_peak, peak, at_peak = tl.peak()
acts = tl.bytes["activations"]
i_act = max(range(len(acts)), key=acts.__getitem__)
end = tl.times_s[-1]
print(f"peak: {peak / MiB:.1f} MiB at {t_peak / end:.0%} of the step; activations peak at "
      f"{tl.times_s[i_act] / end:.0%}")
pd.Series({c: v / MiB for c, v in at_peak.items()}, name="MiB at the peak").round(2)

# %%
params = list(lab.model.parameters())
n_params = sum(p.numel() for p in params)
# exact: fp32 weights and gradients (4 bytes each), AdamW's two fp32 moments plus one 4-byte step per tensor
assert max(tl.bytes["parameters"]) == max(tl.bytes["gradients"]) == 4 * n_params
assert max(tl.bytes["optimizer state"]) == 8 * n_params + 4 * len(params)
per_param = {c: max(tl.bytes[c]) / n_params for c in ("parameters", "gradients", "optimizer state")}
print("bytes per parameter: " + ", ".join(f"{c} {v:.1f}" for c, v in per_param.items())
      + f" -> {sum(per_param.values()):.1f} (the documents: 4 + 4 + 8 = 16 for fp32 AdamW)")
largest = max(at_peak, key=at_peak.get)
print(f"At the peak, {largest} hold {at_peak[largest] / peak:.0%} of the memory"
      + (" and gradients none yet: the peak comes before backward writes its first gradient"
         + (", with every saved tensor of the forward still alive" if at_peak["activations"] >= 0.99 * max(acts) else "")
         + ". The activations set the peak; checkpointing (chapter 05) or a smaller micro-batch lowers it."
         if largest == "activations" and at_peak["gradients"] == 0 else
         ": at this size the activations are not what sets the peak; grow the micro-batch and they will."))

# %% [markdown]
# On a GPU, `--memory` also writes a `torch.cuda.memory` snapshot (`tl.snapshot_path`) to drag
# into https://pytorch.org/memory_viz, and `lab.find_max_batch_size()` saves one by itself when a
# trial runs out of memory. GPU records also carry the allocator's retries and OOM counts
# (`gpu_alloc_retries`, `gpu_ooms`): a retry means the caching allocator had to free its cache
# to fit a block, a warning sign before the first OOM.

# %% [markdown]
# ## 3. A Lab run
#
# The Lab traces too: `lab.run(..., trace=True)` traces one extra step after the
# timed ones (it does not count in tokens/s) and compares it with their median.

# %%
run = lab.run(steps=2, warmup=0, trace=True)
print(f"lab.run trace: {run.trace.short()}; profiler overhead {run.trace.overhead_text()}")

# %% [markdown]
# ## 4. Energy
#
# Every record carries the energy of the run where a counter can be read: NVML's total-energy
# counter on a GPU (Volta and newer), the CPU packages' RAPL counters where the kernel lets this
# user read them. Otherwise the figure is NaN and a note says why; it is never 0.

# %%
r = tunekit.last()
if r.energy_j == r.energy_j:
    print(f"{r.energy_j:.2f} J over {r.wall_s * 1e3:.0f} ms ({r.mean_w:.0f} W mean, {r.energy_source})")
    print(f"lab.run: {run.j_per_token * 1e3:.3f} mJ per token")
else:
    print("energy not measurable here:", [n for n in r.notes if "energy" in n][0])

# %% [markdown]
# ## Exercise
#
# 1. Switch the model to explicit attention (`lab.apply(toggles := lab.resolve(attention='math'))`)
#    and trace again: which categories grow, which shrink, and why? (The math path computes the
#    scores with matmuls and a softmax instead of one fused attention op.)
# 2. Trace with `micro_batch=1` and with `micro_batch=16`: how do the matmul share and (on a GPU)
#    the idle share move? What does that say about small batches?
# 3. Open the Chrome trace of the last `--trace` run in Perfetto and find the optimizer step.
