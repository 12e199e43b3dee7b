# %% [markdown]
# # rljax quickstart (a jupytext "percent" notebook: open it in Jupyter, or run it as a script)
#
# One GRPO step by hand on the embedded arithmetic task: build a tiny policy, sample groups,
# score them, compute advantages, and take one sharded train_step. The test suite executes it.

# %%
import jax
import numpy as np

from rljax import config_loader
from rljax.data import datasets, tokenizer as tokenizer_lib
from rljax.parallel import mesh as mesh_lib
from rljax.train import build, loop

config = config_loader.load_config("configs/grpo.py", [
    ("model.hidden_size", "32"), ("model.intermediate_size", "64"), ("model.num_layers", "1"),
    ("model.num_heads", "2"), ("model.num_kv_heads", "1"), ("rollout.max_new_tokens", "8"),
    ("rollout.prompts_per_step", "2"), ("rollout.group_size", "4"), ("data.prompt_bucket", "8")])
tokenizer = tokenizer_lib.load_tokenizer("char")
model_cfg, params = build.load_policy(config, tokenizer)
print(f"{model_cfg.num_params():,} parameters")

# %% [markdown]
# The TrainState is created directly with the shardings the partition rules give it.

# %%
mesh = mesh_lib.make_mesh(config.mesh)
state, fns, sharding = build.sharded_state_and_fns(config, model_cfg, params, mesh)

# %% [markdown]
# Rollout + rewards on the host (an untrained policy is never right: rewards are all 0 and the
# group advantages are exactly 0, not NaN).

# %%
source = datasets.make_prompt_source(config.data)
run = loop.Run(config=config, model=build.LoadedModel(model_cfg, mesh), tokenizer=tokenizer,
               source=source, task_verifier=build.make_task_verifier(config, source), mesh=mesh,
               fns=fns, state=state, sampling=build.sampling_params(config, tokenizer),
               writer=None, checkpointer=None)
batch, info = loop.collect_batch(run, step=0)
print(batch.completions[:4], info["reward_mean"])

# %%
prepared, score_metrics = fns.prepare_batch(state, *loop.device_batch(run, batch))
assert np.isfinite(np.asarray(prepared.advantages)).all()
state, metrics = fns.train_step(state, prepared)
print({k: float(s / max(c, 1)) for k, (s, c) in jax.device_get(metrics).items()})
