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
# # 15 · Autotune: the fastest configuration that fits
#
# **Claim.** The chapters so far flipped one toggle at a time. With the documents' rules a search
# can do it for you, and cheaply: precision first (it changes what fits), then the attention kernel,
# the optimizer's kernel (fused vs a loop of small ops, the same AdamW), the micro-batch (as large
# as helps, found by the max-batch search), and checkpointing *only* where it buys a micro-batch
# that does not fit without it: "gradient checkpointing slows things down for the given batch
# size, but since it frees up a lot of memory, enabling a much larger BS, it actually improves the
# overall speed". A final race puts the winner against the two best others once more, and
# torch.compile comes last, on the winner.
#
# Each candidate is a real `lab.run`. Candidates race: every round measures the survivors once
# more; from the second round on (one trial may have met a burst of load) the faster half goes on
# and one slower than the leader beyond the **noise band** drops out, so a hopeless candidate costs
# two trials. A challenger replaces the incumbent only if
# it is faster beyond noise, and when the top two (or the finalists of a stage) are not apart the
# result says so. Every trial carries the machine's condition: one measured while other work used
# the machine is measured again and never decides anything. When the band cannot separate the top
# candidates, they get the rest of the budget; if they stay inseparable, the result is
# **inconclusive**, in words and in the chart, rather than a winner picked by chance.

# %%
import torch
import tunekit
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
GPU = torch.cuda.is_available()
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")

# %% [markdown]
# ## 1. A search with a budget
#
# The demo GPT, a 20-second budget on CPU (compile is left out here: its first compile alone can
# take tens of seconds on a CPU; chapter 10 measures it). The progress callback is what the
# dashboard's Autotune button draws as its progress bar.

# %%
# NBVAL_IGNORE_OUTPUT
lab = tunekit.Lab(preset="gpt2-124m" if GPU else "cpu-tiny", seq_len=512 if GPU else 32,
                  micro_batch=8 if GPU else 4)
trials = []
found = lab.autotune(budget_s=120 if GPU else 20, max_micro_batch=64 if GPU else 16,
                     space={"compile": [False]}, steps=3, warmup=1,
                     progress=lambda elapsed, budget, what: trials.append((round(elapsed, 1), what)))
print(f"{len(trials)} trials in {found.elapsed_s:.1f} s of a {found.budget_s:g} s budget "
      f"({found.status}); every one is a run in lab.results(): {len(lab.results())} runs")
print(found.verdict)

# %% [markdown]
# ## 2. The evidence
#
# Every candidate the search considered. Measured ones: the best repeat's tokens/s (each repeat
# scored at its fastest step: on shared cores contention only ever adds time, so the fastest
# figure is the one a busy neighbour cannot drag down), the median of the repeats and the spread
# between them, and how many of its trials ran on a busy machine (kept here, never judged). Pruned
# ones: the rule that pruned them.

# %%
# NBVAL_IGNORE_OUTPUT
ev = found.evidence
cols = ["stage", "label", "tokens_per_s", "tokens_per_s_median", "spread", "repeats", "busy_trials", "steps", "fits",
        "status", "why"]
ev[cols].style.format({"tokens_per_s": "{:,.0f}", "tokens_per_s_median": "{:,.0f}", "spread": "{:.1%}"},
                      na_rep="n/a").hide(axis="index")

# %%
# NBVAL_IGNORE_OUTPUT
found.figure

# %% [markdown]
# ## 3. What held, and why
#
# The pruning rules are facts of this machine, not of the timing: they are checked here.

# %%
pruned = ev[ev.status == "pruned"].set_index("label")["why"]
measured = ev[ev.repeats > 0]
assert (pruned != "").all() and len(measured) >= 1 and found.toggles is not None
assert not ((ev.attention == "flash") & (ev.repeats > 0)).any() or tunekit.core.registry.module_available("flash_attn")
if not GPU:
    assert "fp16 training is refused on CPU" in pruned["fp16"] and "same run as fp32" in pruned["tf32"]
ckpt = ev[ev.checkpointing]
memory_limited = not ckpt.empty and not ckpt.why.str.startswith("memory is not the limit").all()
print("pruned without a trial:", ", ".join(pruned.index))
print("checkpointing:", "tried where it let a bigger micro-batch fit" if memory_limited
      else ckpt.why.iloc[0] if len(ckpt) else "not searched")

# %%
# NBVAL_IGNORE_OUTPUT
start = measured[measured.label == "baseline"]
win = measured[measured.status == "winner"].iloc[0]
dropped_early = measured[(measured.status == "dropped") & (measured.repeats < measured.repeats.max())]
print(f"The search measured {len(measured)} of {len(ev)} candidates in {measured.repeats.sum()} trials; "
      f"{len(dropped_early)} dropped out before the full {measured.repeats.max()} repeats, "
      f"{len(ev) - len(measured)} never ran (pruned by a rule or ruled out by the max-batch search).")
if len(start):
    print(f"{'kept, not proven fastest' if found.inconclusive else 'winner'} {win.label!r}: {win.tokens_per_s:,.0f} "
          f"tokens/s = {win.tokens_per_s / start.tokens_per_s.iloc[0]:.2f}x the starting configuration.")
ahead = (measured.tokens_per_s <= win.tokens_per_s).all()
print("Inconclusive: the noise band cannot tell the winner from " + ", ".join(ev[ev.status == "tied"].label)
      + "; it is kept because nothing beat it, not because it was shown fastest." if found.inconclusive
      else "The top two are within noise: both are as fast here; rerun and either may win." if found.within_noise
      else f"The winner is ahead of every other candidate beyond the noise band (±{found.band:.0%})." if ahead
      else "A candidate measured faster than the winner was not confirmed against it (see the verdict).")
print(found.machine)
for call in found.close_calls:
    print("close call (within noise, either choice is as fast here):", call)
if found.partial:
    print("The budget ran out first: the result is what the search had measured by then.")

# %% [markdown]
# **Conclusion.** The search tried what the rules allow and let the measurements decide the rest:
# what could not run here, or could not help (tf32 on a CPU is fp32; checkpointing when the largest
# micro-batch searched already fits), cost nothing, and a candidate far behind the leader drops out
# after its second trial (the cell above counts those that left early). The verdict above names the
# winner and says whether the runner-up (or a stage's finalist) is within noise, or that the top
# candidates could not be told apart (inconclusive, with the machine's condition beside it), so it
# holds on every run: when two configurations are that close, either is the right answer on this
# machine, and when the noise is wider than their difference, no answer is claimed. `lab.defaults`
# now holds the winner, so the next `lab.run()` trains with it; the weights are as they were before
# the search (it measured, it did not train).
#
# **Exercise.** Rerun with `keep_global_batch=True`: every candidate then trains the same global
# batch, with `grad_accum` making up for smaller micro-batches. Does the winner change? Then press
# *Autotune* in `lab.dashboard()` with a 60 s budget.
