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
# # 16 · Your own loop: one model, three trainers, the same per-step figures
#
# Most training runs already have a loop: a plain `for batch in loader:`, the transformers
# `Trainer`, or Lightning's `Trainer`. `tunekit.Monitor` measures each step inside any of them:
# wall time (the wait for data apart), tokens/s, TFLOPS, MFU and HFU in the Lab's convention,
# memory, and whether the machine was quiet. The two trainers get it through a callback,
# `TunekitCallback`, which also adds its figures to the trainer's own log, so TensorBoard, MLflow
# or a CSV file see them.
#
# Here the same small Llama-shaped model (built from a config, random weights) trains for the same
# number of steps on the same batches three ways. The question: do the three loops run the model
# at the same speed, and if not, where does the time go?

# %%
import logging
import warnings
import plotly.graph_objects as go
import pandas as pd
import torch
import tunekit
with tunekit.core.needs_extra("chapter 16"):   # names the pip extra where transformers or lightning is missing
    from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging
    import lightning as L
    from tunekit.integrations.lightning import TunekitCallback as LightningCallback
    from tunekit.integrations.transformers import TunekitCallback as TrainerCallback

tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
hf_logging.set_verbosity_error()
warnings.filterwarnings("ignore", module="lightning")   # its tips and the small-dataset notice
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)   # "GPU available: False", ...
STEPS, B, S = 24, 4, 128
CFG = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=S)
torch.manual_seed(0)
batches = [torch.randint(0, 256, (B, S)) for _ in range(STEPS)]


def fresh_model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CFG)


def adamw(model):   # the Trainer's default optimizer (adamw_torch_fused), for the other two as well
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


# A process's first training steps pay one-time costs (the allocator's first blocks, each
# kernel's first call): a few untimed steps here keep them out of whichever loop runs first.
warm = fresh_model()
warm_opt = adamw(warm)
for ids in batches[:4]:
    warm(input_ids=ids, labels=ids).loss.backward()
    warm_opt.step()
    warm_opt.zero_grad()
print(f"{STEPS} steps of {B} x {S} tokens; cpu ({torch.get_num_threads()} threads)")

# %% [markdown]
# ## 1. A plain loop
#
# `mon.iter(loader)` wraps the loader: the time `next()` takes is the step's `wait_s`, the rest
# of the step is the model's. The first step is the one whose FLOPs are counted (the counter
# slows it) and the second is warm-up: neither carries a speed.

# %%
model = fresh_model()
opt = adamw(model)
plain = tunekit.Monitor(model, name="plain loop")
for ids in plain.iter(batches):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    plain.log(loss=loss)
plain.close()
plain.results().head()

# %% [markdown]
# ## 2. The transformers `Trainer`
#
# `TunekitCallback()` goes into `callbacks=[...]`; it counts the tokens of each forward the
# Trainer makes (all the micro-batches of a step when accumulating). Its `wait_s` is the time
# between two steps, where the Trainer fetches the next batch and does its own bookkeeping.

# %%
hf_cb = TrainerCallback(name="transformers Trainer")
args = TrainingArguments(output_dir="/tmp/tunekit-16", max_steps=STEPS, per_device_train_batch_size=B,
                         learning_rate=1e-4, logging_steps=8, report_to=[], use_cpu=True,
                         save_strategy="no", disable_tqdm=True, dataloader_drop_last=True)
data = [{"input_ids": row, "labels": row} for ids in batches for row in ids]
trainer = Trainer(model=fresh_model(), args=args, train_dataset=data, callbacks=[hf_cb])
trainer.train()
last_log = [log for log in trainer.state.log_history if "tunekit/tokens_per_s" in log][-1]
print("the Trainer's last step log, with tunekit's figures in it:")
print({k: round(v, 4) for k, v in last_log.items() if k.startswith("tunekit/")})

# %% [markdown]
# ## 3. Lightning
#
# The model is wrapped in a `LightningModule` whose `training_step` calls it; the callback finds
# the model through the module and sends its figures to every logger of the Trainer.


# %%
class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = fresh_model()

    def training_step(self, ids, i):
        return self.model(input_ids=ids, labels=ids).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4, fused=True)


pl_cb = LightningCallback(name="Lightning")
pl_trainer = L.Trainer(max_steps=STEPS, callbacks=[pl_cb], logger=False, enable_progress_bar=False,
                       enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
pl_trainer.fit(Module(), torch.utils.data.DataLoader(batches, batch_size=None))

# %% [markdown]
# ## 4. Side by side
#
# Each loop's steps that measure it (not counted, not warm-up): the median step, tokens/s over
# those steps, MFU against this CPU's calibrated peak, and the share of time spent between the
# model's work (data and the loop's own bookkeeping).

# %%
monitors = {"plain loop": plain, "transformers Trainer": hf_cb.monitor, "Lightning": pl_cb.monitor}


def measured_steps(mon):
    df = mon.results(all=True)
    return df[~df.warmup & ~df.counted & ~df.left & df.error.isna()]


table = pd.DataFrame({name: {"steps": m.summary.measured, "median step (ms)": m.summary.median_step_s * 1e3,
                             "tokens/s": m.summary.per_s, "MFU": m.summary.mfu,
                             "between steps": m.summary.wait_share, "machine": m.record.conditions.verdict}
                      for name, m in monitors.items()}).T
display(table.style.format({"median step (ms)": "{:.1f}", "tokens/s": "{:,.0f}", "MFU": "{:.1%}",
                            "between steps": "{:.1%}"}))
assert all(m.summary.measured == STEPS - 2 for m in monitors.values())   # less the counted and warm-up steps
assert all(m.rows[2]["tokens"] == B * S for m in monitors.values())   # every loop saw 4 x 128 tokens a step

fig = go.Figure()
for name, m in monitors.items():
    d = measured_steps(m)
    fig.add_scatter(x=d.step, y=d.tokens_per_s, mode="lines+markers", name=name)
fig.update_layout(title="tokens/s per step, three loops over the same model and batches",
                  xaxis_title="step", yaxis_title="tokens/s", yaxis_rangemode="tozero", height=380)
fig

# %% [markdown]
# Whether two loops differ is judged on their step times, not read off the chart: `tunekit.verdict`
# compares the best steps of each side against the noise between their next-best steps, and says
# "machine busy" rather than judge steps taken while something else ran.

# %%
base = measured_steps(plain).wall_s.tolist()
for name in ("transformers Trainer", "Lightning"):
    v = tunekit.verdict(base, measured_steps(monitors[name]).wall_s.tolist())
    if v.word in ("within noise", "machine busy"):
        said = f"{name}: {v.word} against the plain loop ({v.speedup:.2f}x, band ±{v.band:.0%})"
    else:
        faster = "faster" if v.speedup > 1 else "slower"
        said = f"{name}: {faster} than the plain loop, {v.speedup:.2f}x (band ±{v.band:.0%})"
    share = monitors[name].summary.wait_share - plain.summary.wait_share
    print(said + f"; time between steps {share:+.1%} of the run against the plain loop's")

# %% [markdown]
# **What to take away.** The model's FLOPs per step are the same in the three loops (same shapes,
# same convention, the same fused AdamW), so a gap in tokens/s is time the loop adds, and the
# monitor says where: inside the step (`step_s`: the Trainer clips gradients to
# `max_grad_norm=1.0` by default and steps a learning-rate schedule, work the other two do not do
# here) or between steps (`wait_s`: fetching and collating batches, logging). On a model this small the loop's own work is a
# visible share of each step; on a real model it shrinks to noise, which is what the verdict above
# would then say. The figures also reached each trainer's log (`tunekit/tokens_per_s`,
# `tunekit/mfu`, ...), and `log_to=["tensorboard:runs", "jsonl:steps.jsonl"]` sends them further.
