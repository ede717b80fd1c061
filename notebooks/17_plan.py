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
# # 17 · Plan before you rent
#
# **Claim.** Whether a training step fits a GPU, and how fast it could possibly run there, can be
# known before renting the GPU. `tunekit.plan` builds the model from its config under fake tensors
# (shapes and dtypes, no memory, no arithmetic), takes one training step, measures it with the code
# that measures a real step, and places it on a device of the spec table: the step's peak memory
# and where it happens, whether it fits, and a speed-of-light bound (every matmul and attention op
# at the dense peak or at the memory bandwidth, whichever takes longer; everything else free).
# The bound is an upper bound on tokens/s and MFU, not a prediction.

# %%
import time
import pandas as pd
import torch
from plotly.subplots import make_subplots
import tunekit
with tunekit.core.needs_extra("chapter 17"):   # names the pip extra where transformers is missing
    from transformers import LlamaConfig
from tunekit.core.memory import estimate as anatomy
from tunekit.core.specs import SPECS
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
GiB = 2**30
print(f"planning on this machine's cpu ({torch.get_num_threads()} threads): no GPU is used by any plan")

# %% [markdown]
# ## 1. The documents' 147M GPT on the spec table's GPUs
#
# The documents' example: GPT with L=12, h=768, a=12 heads, s=512, a 40,512-token vocabulary and
# biases, at micro-batch 64, which they estimate at ~25.3 GB (~30.3 GB with 20% overhead) and say
# fits a 40 GB A100. Planned here in bf16 autocast (fp32 weights) with AdamW. A plan takes three
# fake steps, a few seconds on this machine, so the cell plans three GPUs; `EVERY_GPU = True` plans
# every GPU of the table that lists a memory size and a bf16 peak (longer still: where the step
# does not fit, the plan also tries the remedies, each a fake step of its own).

# %%
# NBVAL_IGNORE_OUTPUT
CFG = tunekit.GPTConfig(vocab_size=40512, n_layer=12, n_head=12, n_embd=768, block_size=512, pos="learned",
                        bias=True)
MB, SEQ = 64, 512   # the documents' micro-batch and context
EVERY_GPU = False
listed = [s.name for s in SPECS if s.memory_gb and s.tflops.get("bf16")]
gpus = listed if EVERY_GPU else ["A100", "H100 SXM", "MI300X"]
t0 = time.perf_counter()
plans = {name: tunekit.plan(CFG, name, precision="bf16", micro_batch=MB, seq_len=SEQ) for name in gpus}
print(f"{len(plans)} plans in {time.perf_counter() - t0:.1f} s ({len(listed)} GPUs of the table list memory "
      "and a bf16 peak)")
table = pd.DataFrame([{"device": n, "memory GiB": p.device_memory_bytes / GiB, "fits": p.fits,
                       "peak GiB": p.peak_bytes / GiB, "needs GiB": p.total_bytes / GiB,
                       "bf16 TFLOPS": p.peak_tflops, "TB/s": p.bandwidth_tbs,
                       "bound tokens/s": p.bound_tokens_per_s, "MFU bound": p.bound_mfu}
                      for n, p in plans.items()]).set_index("device")
assert all(p.components == plans[gpus[0]].components for p in plans.values())   # one step, placed on each GPU
table.style.format({"memory GiB": "{:.1f}", "peak GiB": "{:.2f}", "needs GiB": "{:.2f}", "TB/s": "{:.2f}",
                    "bound tokens/s": "{:,.0f}", "MFU bound": "{:.1%}"})

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=["memory at the step's peak vs the device's",
                                                    "speed-of-light bound"])
fig.add_bar(x=table.index, y=table["needs GiB"], name="the step needs (peak + fixed costs)", row=1, col=1)
fig.add_bar(x=table.index, y=table["memory GiB"], name="the device has", row=1, col=1)
fig.add_bar(x=table.index, y=table["bound tokens/s"], name="bound tokens/s (upper bound)", row=1, col=2)
fig.update_yaxes(title_text="GiB (2^30 bytes)", rangemode="tozero", row=1, col=1)
fig.update_yaxes(title_text="tokens/s per GPU", rangemode="tozero", row=1, col=2)
fig.update_xaxes(title_text="device")
fig.update_layout(title=f"147M GPT, micro-batch {MB} x {SEQ}, bf16 autocast + AdamW", height=420)
fig

# %%
a100 = plans["A100"]
n_params = a100.components["weights"] / 4   # fp32 weights; the output layer shares the embedding's
untied = n_params + CFG.vocab_size * CFG.n_embd
print(f"parameters: {n_params / 1e6:.1f}M (tunekit's GPT ties its output layer to the embedding); with a "
      f"separate {CFG.vocab_size:,} x {CFG.n_embd} output layer {untied / 1e6:.1f}M, the documents' ~147M")
printed = anatomy.worked_example_147m(MB)["as printed (20 B/param)"].total_bytes
need = a100.total_bytes
print(f"the documents' estimate {printed / 1e9:.1f} GB (+20%: {1.2 * printed / 1e9:.1f} GB); the plan needs "
      f"{need / 1e9:.1f} GB = {need / GiB:.2f} GiB at its peak, CUDA context included, "
      + ("so it fits a 40 GB A100 as they found." if need <= 40e9 else "more than a 40 GB A100 holds."))
print(f"fits on {int(table.fits.sum())} of {len(table)} planned GPUs; bound from "
      f"{table['bound tokens/s'].min():,.0f} tokens/s ({table['bound tokens/s'].idxmin()}) to "
      f"{table['bound tokens/s'].max():,.0f} ({table['bound tokens/s'].idxmax()}), "
      f"{table['bound tokens/s'].max() / table['bound tokens/s'].min():.1f}x apart")

# %% [markdown]
# ## 2. An 8B Llama-3-shaped model: one H100, or eight with FSDP?
#
# A transformers `LlamaConfig` of Llama 3 8B's shape (no weights are downloaded or made), pure
# bf16 weights with AdamW, one sequence of 8,192 tokens per GPU. First FSDP over the 8 H100s of one
# node: each rank keeps an eighth of every parameter, gradient and optimizer state, gathers one
# unit's full weights at a time and reduce-scatters the gradients over NVLink. The plan keeps the
# unsharded step's peak too (`phase_peaks`: one device, nothing sharded), which says whether one
# H100 would do.

# %%
# NBVAL_IGNORE_OUTPUT
LLAMA_8B = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
SETTING = dict(precision="bf16", weights="bf16", micro_batch=1, seq_len=8192)
t0 = time.perf_counter()
fsdp = tunekit.plan(LLAMA_8B, "H100 SXM", **SETTING, parallel="fsdp", world_size=8)
print(f"planned in {time.perf_counter() - t0:.1f} s")
fsdp

# %%
whole = max(fsdp.phase_peaks.values())
print(f"one H100 SXM, nothing sharded: the step peaks at {whole / GiB:.1f} GiB before any fixed cost, against "
      f"{fsdp.device_memory_bytes / GiB:.1f} GiB: " + ("it does not fit." if whole > fsdp.device_memory_bytes
                                                        else "it fits before the fixed costs."))
print(f"FSDP over 8: a rank needs {fsdp.total_bytes / GiB:.1f} GiB at its peak, fixed costs included: "
      + (f"fits ({fsdp.headroom_bytes / GiB:.1f} GiB free)." if fsdp.fits
         else f"does not fit ({-fsdp.headroom_bytes / GiB:.1f} GiB over)."))
print(f"communication {fsdp.comm_s * 1e3:.0f} ms per step ("
      + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in fsdp.comm.items())
      + f") against a compute bound of {fsdp.compute_bound_s * 1e3:.0f} ms: "
      + (f"{fsdp.comm_s / fsdp.compute_bound_s:.0%} of it, hidden where it overlaps the compute."
         if fsdp.comm_s <= fsdp.compute_bound_s else "longer than the compute: the links bound the step."))

# %% [markdown]
# The other way to one H100: activation checkpointing, planned on its own. Which components does
# each remedy shrink?

# %%
# NBVAL_IGNORE_OUTPUT
t0 = time.perf_counter()
ckpt = tunekit.plan(LLAMA_8B, "H100 SXM", **SETTING, checkpointing=True)
print(f"planned in {time.perf_counter() - t0:.1f} s")
names = list(dict.fromkeys([*ckpt.components, *fsdp.components]))
fixed = list(dict.fromkeys([*ckpt.fixed, *fsdp.fixed]))
per_device = pd.DataFrame(
    {"one H100, checkpointing": [ckpt.components.get(k, 0.0) for k in names]
     + [ckpt.fixed.get(k, (0.0,))[0] for k in fixed] + [ckpt.total_bytes],
     "FSDP, one rank of 8": [fsdp.components.get(k, 0.0) for k in names]
     + [fsdp.fixed.get(k, (0.0,))[0] for k in fixed] + [fsdp.total_bytes]},
    index=names + fixed + ["needs at the peak"]) / GiB
per_device[per_device.sum(axis=1) > 0].round(3)

# %%
states = ["weights", "gradients", "optimizer_states"]   # checkpointing leaves these whole
full, rank = (sum(p.components[k] for k in states) for p in (ckpt, fsdp))
print(f"FSDP: weights + gradients + AdamW state {full / GiB:.1f} -> {rank / GiB:.2f} GiB per rank "
      f"({full / rank:.1f}x less); activations stay whole on each rank ({fsdp.components['activations'] / GiB:.1f} "
      f"GiB), plus {(fsdp.components.get('gathered_params', 0) + fsdp.components.get('unsharded_grads', 0)) / GiB:.1f}"
      f" GiB of gathered weights and unsharded gradients.")
print(f"checkpointing: activations {ckpt.components['activations'] / GiB:.1f} GiB against "
      f"{fsdp.components['activations'] / GiB:.1f} without (the FSDP rank's); one H100 needs "
      f"{ckpt.total_bytes / GiB:.1f} GiB: "
      + ("fits" if ckpt.fits else "does not fit") + f", for {ckpt.executed_flops / fsdp.executed_flops - 1:+.0%} "
      "executed FLOPs (the recomputed forward).")
print(f"bound per GPU: FSDP {fsdp.bound_tokens_per_s:,.0f} tokens/s (MFU <= {fsdp.bound_mfu:.0%}), one H100 "
      f"with checkpointing {ckpt.bound_tokens_per_s:,.0f} (MFU <= {ckpt.bound_mfu:.0%})")

# %% [markdown]
# ## 3. Is the fake step right? The CPU plan against a real CPU step
#
# On `device="cpu"` the plan is placed on this machine (its RAM, its calibrated matmul peak), so
# the same step can be run for real: `measure_memory` measures one real step's components with
# the same code, and a short `Lab` run gives tokens/s to set against the bound.

# %%
lab = tunekit.Lab(preset="cpu-tiny")
MB3, SEQ3 = 4, 64
cpu_plan = lab.plan("cpu", micro_batch=MB3, seq_len=SEQ3)
s = cpu_plan.setting
x, y = torch.randint(0, lab.config.vocab_size, (2, MB3, SEQ3))   # inputs and targets, as the plan's batch
real = tunekit.measure_memory(lab.model, (x, y), setting=s.replace(device=None), estimate=False).measured   # the plan's Setting, here
side = pd.DataFrame({"plan (fake step) bytes": cpu_plan.components,
                     "measured (real step) bytes": {k: real[k] for k in cpu_plan.components}})
side["difference"] = side["measured (real step) bytes"] - side["plan (fake step) bytes"]
equal = int((side["difference"] == 0).sum())
print(f"{equal} of {len(side)} components equal to the byte; largest difference "
      f"{side['difference'].abs().max():,.0f} bytes")
assert equal == len(side)
side.style.format("{:,.0f}")

# %%
# NBVAL_IGNORE_OUTPUT
run = lab.run(steps=4, warmup=1, micro_batch=MB3, seq_len=SEQ3)
best = run.tokens_per_step / run.step_s_min   # the fastest step: the strictest test of a bound
ratio = best / cpu_plan.bound_tokens_per_s
print(f"measured {run.tokens_per_s:,.0f} tokens/s over the run, {best:,.0f} in its fastest step; bound "
      f"{cpu_plan.bound_tokens_per_s:,.0f}: measured/bound = {ratio:.3g} at best "
      f"(machine {run.conditions.verdict if run.conditions else 'not read'})")
print(f"executed FLOPs per step: run {run.flops_per_step:,.0f}, plan {cpu_plan.executed_flops:,.0f}; "
      f"model FLOPs: run {run.model_flops_per_step:,.0f}, plan {cpu_plan.model_flops:,.0f}")
print(f"MFU: measured {run.mfu:.1%}, bound {cpu_plan.bound_mfu:.1%} (both against {cpu_plan.peak_tflops:.3f} "
      "TFLOPS, this CPU's calibrated matmul peak)")
assert ratio <= 1, "a measurement above its speed of light: the plan's bound is wrong"

# %% [markdown]
# ## 4. Where in the step the memory peaks
#
# The plan also tracks the bytes alive over a steady step (optimizer state already made), storage by
# storage. `tunekit.planning.plot_plan` draws them beside the components; here the 147M GPT on the H100 SXM
# of section 1.

# %%
p = plans["H100 SXM"]
tunekit.planning.plot_plan(p)

# %%
held = sum(p.components.values())
logits = MB * SEQ * CFG.padded_vocab_size * 4   # one fp32 (B, T, V) tensor
print(f"peak {p.peak_bytes / GiB:.2f} GiB at {p.peak_at}")
print("each phase's peak: " + ", ".join(f"{ph} {b / GiB:.2f} GiB" for ph, b in p.phase_peaks.items()))
print(f"the components sum to {held / GiB:.2f} GiB; the peak is {(p.peak_bytes - held) / GiB:+.2f} GiB from "
      f"that: temporaries no component holds (one fp32 logits tensor, {MB} x {SEQ} x {CFG.padded_vocab_size:,}, "
      f"is {logits / GiB:.2f} GiB)")
assert max(b for _, b in p.timeline) == p.peak_bytes

# %% [markdown]
# ## Conclusion and exercise

# %%
print(f"1. The documents' 147M GPT at micro-batch {MB} x {SEQ}: needs {a100.total_bytes / GiB:.1f} GiB; fits "
      f"{', '.join(table.index[table.fits]) or 'none'} of the planned GPUs; bound "
      f"{table['bound tokens/s'].min():,.0f}-{table['bound tokens/s'].max():,.0f} tokens/s.")
print(f"2. 8B at 1 x 8192, bf16 weights + AdamW: one H100 "
      f"{'does not fit' if whole > fsdp.device_memory_bytes else 'fits'} ({whole / GiB:.0f} GiB at the peak); "
      f"with checkpointing {ckpt.total_bytes / GiB:.0f} GiB "
      f"({'fits' if ckpt.fits else 'over'}); FSDP over 8 {fsdp.total_bytes / GiB:.0f} GiB per rank "
      f"({'fits' if fsdp.fits else 'over'}), communication {fsdp.comm_s / fsdp.compute_bound_s:.0%} of the "
      "compute bound.")
print(f"3. On this CPU the plan's components equal a real step's in {equal} of {len(side)} lines; a real run's "
      f"fastest step reached {ratio:.3g} of the bound (measured/bound <= 1, as a bound must be; machine "
      f"{run.conditions.verdict if run.conditions else 'not read'}).")
print(f"4. The step peaks at {p.peak_at}, {p.peak_bytes / GiB:.1f} GiB, "
      f"{(p.peak_bytes - held) / GiB:.1f} GiB above the sum of the components.")

# %% [markdown]
# **Exercise.** Plan the 147M GPT with `checkpointing=True`, then with `search=True`: how large a
# micro-batch fits an L4 (24 GB), and what does the bound say that micro-batch costs in tokens/s?
