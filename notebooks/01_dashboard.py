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
# # 01 · The training lab and its dashboard
#
# `tunekit.Lab` keeps one model, its data and its optimizer alive, and trains it under *toggles*:
# precision, activation checkpointing, micro batch, gradient accumulation, sequence length,
# optimizer, attention implementation, `torch.compile`. Every `lab.run(...)` applies the toggles to
# the live model, runs a few untimed warm-up steps, then times each step with the device
# synchronized. FLOPs are counted once per configuration on a separate, untimed step, so the counter
# never slows a timed one.
#
# The model here is the `cpu-tiny` preset of tunekit's byte-level GPT (about 0.43 M parameters),
# trained on Python's own standard-library sources: nothing is downloaded.

# %%
import tunekit
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer

lab = tunekit.Lab(preset="cpu-tiny", micro_batch=8, seq_len=128)
print(lab.config)
print(f"{lab.model.num_params():,} parameters, device: {lab.device}, log: {lab.log_path}")

# %% [markdown]
# ## Three runs: a baseline, bf16, and activation checkpointing
#
# Only the toggles you pass change; every other toggle comes back to the lab's defaults, so each run
# is comparable with the baseline. Every run keeps training the same model, so a run's loss starts
# where the previous run's stopped.

# %%
base = lab.run(steps=8)
bf16 = lab.run(steps=8, precision="bf16")
ckpt = lab.run(steps=8, checkpointing=True)

cols = ["run_id", "label", "tokens_per_s", "step_s", "tflops", "mfu", "hfu",
        "peak_mem_bytes", "saved_bytes", "loss", "flops_source"]
lab.results(all=True)[cols]   # lab.results() shows the columns read first; all=True has every one

# %% [markdown]
# What to read in that table:
#
# - **`saved_bytes`** is what autograd keeps for the backward pass of one micro batch. Checkpointing
#   drops the per-block activations and keeps only each block's input (the cell below prints how
#   much that leaves); the price is a second forward through each block during backward.
# - That price shows in **HFU vs MFU**: HFU counts the FLOPs the hardware executed (recomputation
#   included), MFU only those the model needs (6N per token plus attention). With checkpointing HFU
#   rises above MFU: the recomputed FLOPs take time without advancing the model. Whether that time
#   shows in tokens/s on this machine is judged below from repeated runs, not from one row each.
# - On CPU the peak is the process's resident memory (Python and torch included), so one run's own
#   tensors are only part of that figure; on a GPU it is torch's allocator peak. MFU here is
#   measured against the *calibrated* matmul peak of this CPU, since a CPU has no spec-sheet figure.

# %%
print(f"checkpointing kept {ckpt.saved_bytes / base.saved_bytes:.0%} of the baseline's saved activations")
print(f"executed / model FLOPs: baseline {base.flops_per_step / base.model_flops_per_step:.2f}, "
      f"checkpointing {ckpt.flops_per_step / ckpt.model_flops_per_step:.2f}")
print("peak used for MFU:", base.peak_tflops_source)
# one run of each is one sample: repeat each setting once more and judge against the noise
again = {k: lab.run(steps=8, verbose=False, **t) for k, t in
         [("base", {}), ("bf16", {"precision": "bf16"}), ("ckpt", {"checkpointing": True})]}
print("bf16 vs fp32: " + tunekit.verdict([base, again["base"]], [bf16, again["bf16"]]).conclusion(
    helped="bf16 steps are faster on this machine.",
    within_noise="no speed difference this machine can show at this size.",
    hurt="bf16 steps are slower here; where a CPU lacks fast bf16 kernels, the casts cost more than they save."))
print("checkpointing: " + tunekit.verdict([base, again["base"]], [ckpt, again["ckpt"]]).conclusion(
    hurt="the recomputed forward costs tokens/s.",
    within_noise="the recompute is too small a share of this step to show above the noise.",
    helped="faster here, which recomputation alone cannot explain: rerun to see whether it repeats."))

# %%
lab.compare()  # tokens/s and peak memory per run; the baseline (run 0) is red

# %% [markdown]
# ## The dashboard
#
# Every toggle has a control; **Run** trains with them and appends a row, **Find max batch**
# searches the largest micro batch that fits (on CPU, within the memory budget you set).
# Combinations that cannot run — fp16 on a CPU, flash attention without CUDA, a micro batch of 0 —
# are explained above the table instead of raising.

# %%
dash = lab.dashboard()
dash

# %% [markdown]
# The dashboard can be driven from code too, which is how it is tested: set a control, click.

# %%
dash.controls["steps"].value = 8
dash.controls["precision"].value = "fp16"   # refused on CPU: read the explanation
msg = dash.message.value
print(msg.split("⚠", 1)[1][:160] + " ..." if "⚠" in msg else "fp16 is accepted on this device")
dash.controls["precision"].value = "bf16"
dash.controls["optimizer"].value = "adamw_fused"
dash.run_button.click()
dash.table_df.tail(3)

# %% [markdown]
# ## How large a micro batch fits?
#
# The search doubles the micro batch until a step no longer fits, then bisects between the last fit
# and the first miss. Each trial is one real training step; after each one memory is handed back so
# the process returns to its baseline. On a GPU a miss is a CUDA out-of-memory error; on CPU it is a
# peak above the budget given here (64 MiB above where the process stood).

# %%
found = lab.find_max_batch_size(memory_budget_bytes=64 * 2**20, limit=64)
print(found)
print(f"baseline {found.baseline_bytes / 2**20:.0f} MiB -> after the search {found.after_bytes / 2**20:.0f} MiB")
found.table()

# %% [markdown]
# ## Tune your own model
#
# Everything above works on a model you bring. Here: a Llama-style decoder from Hugging Face
# transformers, built from a config (random weights, nothing downloaded). The Lab makes its batches
# within the model's vocabulary, takes the loss from `labels`, picks a sequence length within
# `max_position_embeddings`, and switches checkpointing (`activation_checkpointing_enable`) and
# attention (`"math"` is transformers' `"eager"`) on the live model.

# %%
with tunekit.core.needs_extra("this part of chapter 01"):   # names the pip extra where transformers is missing
    from transformers import AutoModelForCausalLM, LlamaConfig

cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
llama = tunekit.Lab(AutoModelForCausalLM.from_config(cfg), micro_batch=4, seq_len=128)
runs = [llama.run(steps=4), llama.run(steps=4, attention="math"),
        llama.run(steps=4, checkpointing=True)]
llama.results(all=True)[["label", "tokens_per_s", "mfu", "hfu", "flops_per_step", "model_flops_per_step",
                           "saved_bytes"]]

# %% [markdown]
# MFU counts the model's work in one convention (6 x matmul weights per token + causal attention
# at half), whatever kernel ran: the same for `sdpa` and `math`. HFU counts what executed: the
# eager `math` path computes the masked half of the scores, checkpointing recomputes each block.

# %%
sdpa, eager, ckpt = runs
assert sdpa.model_flops_per_step == eager.model_flops_per_step == ckpt.model_flops_per_step
print(f"executed / model FLOPs: sdpa {sdpa.flops_per_step / sdpa.model_flops_per_step:.2f}, "
      f"math {eager.flops_per_step / eager.model_flops_per_step:.2f}, "
      f"checkpointing {ckpt.flops_per_step / ckpt.model_flops_per_step:.2f}")
print(f"saved activations: math keeps {eager.saved_bytes / sdpa.saved_bytes:.1f}x what sdpa keeps "
      f"(the s x s scores); checkpointing keeps {ckpt.saved_bytes / sdpa.saved_bytes:.0%}")
assert eager.saved_bytes > sdpa.saved_bytes > ckpt.saved_bytes

# %% [markdown]
# The memory anatomy reads the same config: parameters exact, activations from what transformers'
# Llama layers save, next to the measured step.

# %%
rep = tunekit.measure_memory(llama)
assert abs(rep.error("activations")) < 0.10
rep.to_frame()
