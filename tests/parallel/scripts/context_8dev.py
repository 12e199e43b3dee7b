"""Run with 8 simulated CPU devices (XLA_FLAGS set by the test): every row split over the mesh's
``context`` axis (``rljax.parallel.context``) against one device. Prints one JSON line per case.

Arguments (any of), each ``KIND:MESH[;MESH...]`` with a mesh ``data,fsdp,context,tensor``
(the test names its meshes):

- ``model:...``: logits, log-probs, entropies (Gemma's final soft-cap on) and the gradient of a
  ``(sum, count)`` loss of a 2-layer model (a sliding-window layer and a full one) over rows of
  37 slots (no N divides it: the padded path) packed with 2-3 segments that cross the devices'
  stripes, against ``transformer`` on one device;
- ``train:...``: one full GRPO ``score`` + ``train_step`` (AdamW) against the 1-device step; a
  mesh with ``data > 1`` packs its rows;
- ``decode:N[;N...]``: greedy sampling through the striped KV cache on context N against the
  unsplit sampler (tokens and log-probs), prompts of 11 slots (left-padded to a multiple of N).
"""
import json
import os
import sys

import jax

jax.config.update("jax_default_matmul_precision", "highest")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rljax import algos  # noqa: E402
from rljax.models import transformer  # noqa: E402
from rljax.models.config import ModelConfig  # noqa: E402
from rljax.parallel import context as context_lib, mesh as mesh_lib, rules  # noqa: E402

assert jax.device_count() == 8, jax.devices()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# A sliding-window layer and a full one; 4 query heads over 2 kv heads; blocks of 3 slots, so a
# device's stripe spans several blocks and the kernel skips some at every ring step.
CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, model_type="llama", attention="blockwise",
                  attention_block=3, sliding_window=6,
                  layer_types=("sliding_attention", "full_attention"), final_logit_softcap=1.0)
B, S = 2, 37


def mesh_of(shape):
  d, f, c, t = shape
  return mesh_lib.make_mesh(dict(data=d, fsdp=f, expert=1, context=c, tensor=t),
                            jax.devices()[:d * f * c * t])


def packed_rows():
  """Segment ids [B, S]: row 0 packs 3 sequences (13, 15, 6 slots) then 3 of padding, row 1 has
  5 slots of padding, 2 sequences (20, 12): every sequence crosses stripes on every mesh."""
  seg = np.zeros((B, S), np.int32)
  seg[0, :13], seg[0, 13:28], seg[0, 28:34] = 1, 2, 3
  seg[1, 5:25], seg[1, 25:] = 1, 2
  tokens = np.random.default_rng(0).integers(1, CFG.vocab_size, (B, S)).astype(np.int32)
  return jnp.asarray(tokens * (seg > 0)), jnp.asarray(seg)


def next_targets(tokens):
  return jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))


def loss_mask(seg):
  """Slots whose next slot is in the same segment (what a log-prob loss reads)."""
  nxt = jnp.pad(seg[:, 1:], ((0, 0), (0, 1)))
  return ((seg > 0) & (nxt == seg)).astype(jnp.float32)


def stats_out(model, hidden, targets):
  logp, entropy = algos.token_logprobs_and_entropy(hidden, model.head_weight(), targets, chunk=4,
                                                   softcap=CFG.final_logit_softcap)
  return dict(logits=model.logits(hidden), logp=logp, entropy=entropy,
              raw=jnp.abs(hidden @ model.head_weight()).max(-1))


def loss_of(stats, mask):
  """A ``(sum, count)`` loss: the mean of -logp - 0.01 entropy over ``mask``."""
  total = ((-stats["logp"] - 0.01 * stats["entropy"]) * mask).sum()
  return total / mask.sum()


def reference(params, tokens, seg):
  hidden, model, _ = transformer.forward_with_routes(CFG, params, tokens, seg)
  return stats_out(model, hidden, next_targets(tokens))


def split(context):
  def fn(params, tokens, seg):
    return context_lib.per_token(CFG, params, tokens, seg, context, "lm", stats_out)[0]
  return fn


def max_diff(a, b, mask=None):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  d = np.abs(a - b)
  if mask is not None:
    d = d * np.asarray(mask).reshape(mask.shape + (1,) * (d.ndim - mask.ndim))
  return float(d.max())


def model_cases(shapes):
  # Weights 3x the init's: logits up to ~4x the cap, so the soft-cap bends them.
  params = jax.tree.map(lambda x: 3 * x, transformer.init_params(CFG, seed=0))
  tokens, seg = packed_rows()
  mask = loss_mask(seg)
  valid = seg > 0
  ref = jax.jit(reference)(params, tokens, seg)
  grad_ref = jax.jit(jax.grad(lambda p: loss_of(reference(p, tokens, seg), mask)))(params)
  for shape in shapes:
    mesh = mesh_of(shape)
    context = rules.context_layout(mesh)
    placed = rules.shard_params(params, rules.param_shardings(
        mesh, transformer.logical_axes(CFG), transformer.param_shapes(CFG)))
    fn = split(context)
    out = jax.jit(fn)(placed, tokens, seg)
    grads = jax.jit(jax.grad(lambda p: loss_of(fn(p, tokens, seg), mask)))(placed)
    print(json.dumps(dict(
        kind="model", mesh=list(shape),
        logits=max_diff(out["logits"], ref["logits"], valid),
        logits_scale=float(np.abs(np.asarray(ref["logits"])).max()),
        logp=max_diff(out["logp"], ref["logp"], mask),
        entropy=max_diff(out["entropy"], ref["entropy"], valid),
        grad=max(max_diff(a, b) for a, b in zip(jax.tree.leaves(grads),
                                                jax.tree.leaves(grad_ref))),
        grad_scale=max(float(np.abs(np.asarray(g)).max()) for g in jax.tree.leaves(grad_ref)),
        raw_over_cap=float(np.asarray(ref["raw"]).max()) / CFG.final_logit_softcap)),
        flush=True)


# --- the full step --------------------------------------------------------------------------------

def train_once(shape, pack=False):
  from rljax.algorithm import resolve
  from rljax.config import loader as config_loader
  from rljax.data.tokenizer import load_tokenizer
  from rljax.models import tiny_config
  from rljax.train import build, loop
  from tests.train import tiny
  tok = load_tokenizer("char")
  d, f, c, t = shape
  overrides = {
      "model.hidden_size": "32", "model.intermediate_size": "64", "model.num_heads": "4",
      "model.num_kv_heads": "4", "model.attention_block": "3", "rollout.max_new_tokens": "8",
      "rollout.prompts_per_step": "2", "rollout.group_size": "4", "optim.lr": "1e-3",
      "algo.minibatches": "1", "algo.micro_batches": "1", "algo.epochs": "1",
      "algo.kl_placement": "loss", "algo.entropy_coef": "0.01",
      "mesh.data": str(d), "mesh.fsdp": str(f), "mesh.context": str(c), "mesh.tensor": str(t)}
  if pack:  # chunks of 16 tokens per data shard: packed rows of 16 slots, split over context
    overrides |= {"model.pack": "True", "model.forward_tokens": "16"}
  config = config_loader.load_config(os.path.join(ROOT, "configs", "algos", "grpo.py"),
                                     list(overrides.items()))
  mesh = mesh_of(shape)
  cfg = tiny_config(config.model, tok.vocab_size, eos_token_id=tok.eos_id,
                    pad_token_id=tok.pad_id)
  params = transformer.init_params(cfg, seed=0)
  state, fns, _ = build.sharded_state_and_fns(config, cfg, params, mesh)
  hp = resolve(config).hparams
  rollout = tiny.synthetic_rollout(8, 8, 8, tok.vocab_size, [1, 0, 0, 1, 1, 1, 0, 0], 0)
  batch, _ = fns.score(state, loop.to_device(rollout, mesh), hp)
  new_state, metrics = fns.train_step(state, batch, hp)
  host = jax.tree.map(np.asarray, new_state.params)
  moved = max(float(np.abs(a - np.asarray(b)).max())
              for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(params)))
  return dict(loss=float(metrics["loss"][0]) / float(metrics["loss"][1]),
              entropy=float(metrics["entropy"][0]) / float(metrics["entropy"][1]),
              params=host, moved=moved)


def train_cases(shapes):
  ref = train_once((1, 1, 1, 1))
  for shape in shapes:
    pack = shape[0] > 1
    r = train_once(shape, pack)
    print(json.dumps(dict(
        kind="train", mesh=list(shape), pack=pack, loss=r["loss"], loss_ref=ref["loss"],
        entropy=r["entropy"], entropy_ref=ref["entropy"], moved=ref["moved"],
        param=max(max_diff(a, b) for a, b in zip(jax.tree.leaves(r["params"]),
                                                 jax.tree.leaves(ref["params"]))))), flush=True)


# --- decode ---------------------------------------------------------------------------------------

def decode_cases(contexts):
  from rljax.rollout import sampler as sampler_lib
  from rljax.rollout.sampling import SamplingParams
  params = transformer.init_params(CFG, seed=1)
  # Larger weights: the greedy tokens then depend on the context (not one token over and over).
  params = jax.tree.map(lambda x: x * 25 if x.ndim == 2 else x, params)
  sp = SamplingParams(greedy=True, max_new_tokens=24, stop_ids=(), pad_id=0)
  rng = np.random.default_rng(2)
  prompts = rng.integers(1, CFG.vocab_size, (2, 11)).astype(np.int32)
  mask = np.ones((2, 11), np.int32)
  mask[1, :4] = 0  # a left-padded prompt
  prompts = prompts * mask

  def run(c):
    mesh = mesh_of((1, 1, c, 1))
    fn = sampler_lib.make_sampler(CFG, sp, 2, mesh=mesh, data_axis=rules.batch_axes(),
                                  context=rules.context_layout(mesh))
    out = fn(params, prompts, mask, jax.random.key(0))
    return np.asarray(out.tokens), np.asarray(out.sampler_logp), np.asarray(out.mask)

  ref = run(1)
  for (c,) in contexts:
    toks, logp, m = run(c)
    print(json.dumps(dict(kind="decode", context=c, tokens_equal=bool(np.array_equal(toks, ref[0])),
                          mask_equal=bool(np.array_equal(m, ref[2])),
                          logp=float(np.abs(logp - ref[1]).max()),
                          distinct=int(len(np.unique(ref[0]))))), flush=True)


if __name__ == "__main__":
  cases = dict(model=model_cases, train=train_cases, decode=decode_cases)
  for arg in sys.argv[1:]:
    kind, _, meshes = arg.partition(":")
    cases[kind]([tuple(map(int, m.split(","))) for m in meshes.split(";")])
