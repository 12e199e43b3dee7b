"""One GRPO step (sample -> score -> update) of rljax against PyTorch peers, in one process.

  python benchmarks/train_step.py [--steps 5] [--new-tokens 16,128,256]
                                  [--rljax "default;model.forward_tokens=0"]
                                  [--peers torch,trl]

Every side, in this one process and on the same CPU threads: a ~0.8M-parameter Llama (hidden 128,
4 layers, 4 heads / 2 KV heads, MLP 384, vocab 48), 8 prompts x 8 completions, prompts of 8
tokens, exactly ``--new-tokens`` sampled tokens (no early stop), a clipped GRPO loss with k3 KL
(beta 0.04), backward and AdamW, float32. Rewards are random (verifiers are Python on every side
and not what is measured). Peers:

- ``torch``: a hand-written PyTorch/transformers GRPO step (``generate``, old and reference
  log-probs in one no-grad forward each, the loss, backward, clipping, AdamW).
- ``trl``: TRL's ``GRPOTrainer`` (``benchmarks/trl_peer.py``), where TRL is installed (the
  ``bench`` extra) and on the CPU only. Its phases come from wrappers around its own methods.

Phases (median seconds over ``--steps`` steps after a warm-up step): ``rollout`` (sampling),
``scoring`` (rljax: ``fns.score``, the reference model's forward and the advantages; torch: the
old and reference forwards; TRL: rewards, reference forward, advantages), ``train`` (the policy's
forward and backward and the optimizer), ``update = scoring + train`` (TRL's non-generation part)
and the whole ``step``. Ratios are peer / rljax (above 1: rljax is faster).

FLOP/s: the useful FLOPs of the update (reference forward + policy forward + backward at 2x the
forward, counted as ``benchmarks/sampler.py`` counts them: the weight matmuls at every position,
causal attention over the filled context, the output head at the completion positions) divided by
the update's seconds, and as a fraction of the float32 2048^3 matmul FLOP/s measured at the
start of this run (the faster of XLA and torch). The compile time of rljax's first step is
printed separately. rljax runs as ``rljax train`` does: on CPU one JAX device per core
(``mesh.cpu_devices``, -1 by default; the first ``--rljax`` column may set it), its sampler,
scoring and update splitting the rows over them.

Where JAX's default backend is a GPU, rljax runs on one GPU and the torch peer on CUDA (every phase
synchronised before its clock stops), and the GPU, the matmul precisions (XLA may use TF32 for
float32 dots, torch does not unless ``allow_tf32`` is set) and both peak device memories are
printed too. ``--rljax`` runs rljax once per ``;``-separated set of config overrides (``key=value``
pairs separated by ``,``; ``default`` for none), one column each, the first one the ratios'
denominator: e.g. ``default;model.forward_tokens=0`` against the unchunked update, or
``default;model.attention_block=512``.
"""
import argparse
import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rljax.config import loader as config_loader  # noqa: E402
from rljax.models import tiny_config, transformer# noqa: E402
from rljax.parallel import mesh as mesh_lib  # noqa: E402
from rljax.rollout import SamplingParams  # noqa: E402
from rljax.algorithm import resolve  # noqa: E402
from rljax.train import build  # noqa: E402
from bench_common import matmul_flops, matmul_precisions  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, PROMPTS, GROUP, PROMPT_LEN = 48, 8, 8, 8


PHASES = ("rollout", "scoring", "train", "update", "step")


def phases(t0, t1, t2, t3) -> dict:
  """Seconds per phase from the clock at the start, after the rollout, the scoring, the train."""
  return {"rollout": t1 - t0, "scoring": t2 - t1, "train": t3 - t2, "update": t3 - t1,
          "step": t3 - t0}


def hf_config(model_cfg):
  import transformers
  return transformers.LlamaConfig(
      vocab_size=VOCAB, hidden_size=model_cfg.hidden_size,
      intermediate_size=model_cfg.intermediate_size, num_hidden_layers=model_cfg.num_layers,
      num_attention_heads=model_cfg.num_heads, num_key_value_heads=model_cfg.num_kv_heads,
      tie_word_embeddings=model_cfg.tie_embeddings, pad_token_id=0, eos_token_id=1,
      bos_token_id=2)


def update_flops(cfg, new_tokens: int) -> float:
  """Useful FLOPs of one update: reference forward + policy forward + backward (2x forward),
  each over ``PROMPTS x GROUP`` rows of ``PROMPT_LEN + new_tokens`` positions (weight matmuls at
  every position, causal attention over the filled context, the head at the completion
  positions; ``benchmarks/sampler.py``'s count)."""
  d, f, h, g, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                    cfg.head_dim)
  s = PROMPT_LEN + new_tokens
  per_position = 2 * cfg.num_layers * (d * (h + 2 * g) * dh + h * dh * d + 3 * d * f)
  attn_per_key = 4 * cfg.num_layers * h * dh  # q.k and p.v
  forward = s * per_position + attn_per_key * s * (s + 1) / 2 + 2 * d * cfg.vocab_size * new_tokens
  return 4 * forward * PROMPTS * GROUP


def parse_overrides(column: str) -> list[tuple[str, str]]:
  """``"k=v,k2=v2"`` -> ``[(k, v), (k2, v2)]``; ``"default"`` -> no overrides."""
  if column == "default":
    return []
  pairs = [item.split("=", 1) for item in column.split(",")]
  if any(len(p) != 2 or not p[0] for p in pairs):
    raise SystemExit(f"--rljax column {column!r}: expected key=value pairs separated by ','")
  return [(k, v) for k, v in pairs]


def rljax_config(new_tokens: int, column: str = "default"):
  """``configs/algos/grpo.py`` at the benchmark's sizes with ``column``'s overrides
  (``parse_overrides``)."""
  return config_loader.load_config(os.path.join(ROOT, "configs", "algos", "grpo.py"), [
      ("rollout.prompts_per_step", str(PROMPTS)), ("rollout.group_size", str(GROUP)),
      ("rollout.max_new_tokens", str(new_tokens)), ("data.prompt_bucket", str(PROMPT_LEN))]
      + parse_overrides(column))


def start_devices(columns: list[str], new_tokens: int) -> int:
  """JAX's CPU devices as ``rljax train`` makes them (``mesh.cpu_devices``), from the first
  column's config, before JAX starts; every column runs on them, so only the first may set the
  key. Returns the number of devices."""
  if any("mesh.cpu_devices" in c for c in columns[1:]):
    raise SystemExit("--rljax: mesh.cpu_devices splits the CPU once per process; set it in the "
                     "first column only (run the benchmark again for another count)")
  mesh_lib.start_cpu_devices(rljax_config(new_tokens, columns[0]))
  return len(jax.devices())


def rljax_step_fn(new_tokens: int, column: str = "default"):
  """``column``: config overrides of this rljax side (``parse_overrides``)."""
  config = rljax_config(new_tokens, column)
  model_cfg = tiny_config(config.model, VOCAB)
  params = transformer.init_params(model_cfg, seed=0)
  mesh = mesh_lib.make_mesh(config.mesh)
  state, fns, _ = build.sharded_state_and_fns(config, model_cfg, params, mesh)
  hp = resolve(config).hparams
  # stop_ids=() : exactly new_tokens tokens, as the peer is forced to generate.
  sp = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, greedy=False,
                      max_new_tokens=new_tokens, stop_ids=(), pad_id=0)
  # The RL loop's rollout engine: rows split over the mesh's batch axes (rljax.train.build).
  engine = build.make_engine(config, model_cfg, mesh, tokenizer=None)

  def sample(params, tokens, mask, key):
    engine.load_weights(params, 0)
    return engine.generate(tokens, mask, key, sp, GROUP)
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, VOCAB, (PROMPTS, PROMPT_LEN)).astype(np.int32)
  prompt_mask = np.ones_like(prompts)
  holder = {"state": state}

  def step(i):
    t0 = time.perf_counter()
    out = sample(holder["state"].params, prompts, prompt_mask, jax.random.PRNGKey(i))
    out = jax.device_get(out)
    t1 = time.perf_counter()
    rewards = np.random.default_rng(i).integers(0, 2, PROMPTS * GROUP).astype(np.float32)
    rollout = out.replace(rewards=rewards, correct=rewards > 0, row_valid=np.ones_like(rewards))
    batch, _ = fns.score(holder["state"], rollout, hp)
    jax.block_until_ready(batch)
    t2 = time.perf_counter()
    holder["state"], metrics = fns.train_step(holder["state"], batch, hp)
    jax.block_until_ready(jax.device_get(metrics))
    t3 = time.perf_counter()
    return phases(t0, t1, t2, t3)

  return step, model_cfg


def torch_step_fn(new_tokens: int, model_cfg, device: str = "cpu"):
  import copy

  import torch
  import transformers
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  torch.manual_seed(0)
  hf = hf_config(model_cfg)
  policy = transformers.LlamaForCausalLM(hf).to(device)
  ref = copy.deepcopy(policy).eval()
  opt = torch.optim.AdamW(policy.parameters(), lr=1e-6, weight_decay=0.0)
  rng = np.random.default_rng(0)
  prompts = torch.tensor(rng.integers(3, VOCAB, (PROMPTS, PROMPT_LEN)), device=device)
  prompts = prompts.repeat_interleave(GROUP, 0)

  def token_logp(model, seq):
    logits = model(seq).logits[:, PROMPT_LEN - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, seq[:, PROMPT_LEN:, None])[..., 0]

  def step(i):
    t0 = time.perf_counter()
    policy.eval()
    with torch.no_grad():
      seq = policy.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                            top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                            pad_token_id=0)
    sync()
    t1 = time.perf_counter()
    rewards = torch.tensor(np.random.default_rng(i).integers(0, 2, PROMPTS * GROUP),
                           dtype=torch.float32, device=device).view(PROMPTS, GROUP)
    adv = ((rewards - rewards.mean(1, keepdim=True))
           / (rewards.std(1, keepdim=True) + 1e-6)).view(-1, 1)
    with torch.no_grad():
      old_logp = token_logp(policy, seq)
      ref_logp = token_logp(ref, seq)
    sync()
    t2 = time.perf_counter()
    policy.train()
    logp = token_logp(policy, seq)
    ratio = torch.exp(logp - old_logp)
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    x = (ref_logp - logp).clamp(-20, 20)
    kl = (torch.exp(x) - x - 1).clamp(-10, 10)
    loss = ((pg + 0.04 * kl).mean(1)).mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    opt.step()
    sync()
    return phases(t0, t1, t2, time.perf_counter())

  return step


def medians(runs: list) -> dict:
  return {k: statistics.median(r[k] for r in runs) for k in PHASES}


def trl_available() -> bool:
  try:
    import trl  # noqa: F401
  except ImportError:
    return False
  return True


def measure(new_tokens: int, args, columns, peers, gpu: bool) -> dict:
  """Median phases of rljax (per column) and of each peer at one length, and compile times.
  After one warm-up step each, the sides take turns step by step (with TRL: between its steps),
  so that a machine whose load changes slows them alike."""
  sides, compile_s = {}, {}
  for column in columns:
    step, model_cfg = rljax_step_fn(new_tokens, column)
    t = time.perf_counter()
    step(10_000)  # compile
    compile_s[column] = time.perf_counter() - t
    sides[f"rljax {column}"] = step
  if "torch" in peers:
    sides["torch"] = torch_step_fn(new_tokens, model_cfg, "cuda" if gpu else "cpu")
    sides["torch"](10_000)  # warm-up
  runs = {name: [] for name in sides}

  def one_round(i):
    for name, step in sides.items():
      runs[name].append(step(i))

  if "trl" in peers:
    from trl_peer import TrlPeer
    trl_peer = TrlPeer(hf_config(model_cfg), new_tokens=new_tokens, prompts=PROMPTS, group=GROUP,
                       prompt_len=PROMPT_LEN, vocab=VOCAB, steps=args.steps,
                       between_steps=lambda i: i > 0 and one_round(i))  # step 0: TRL's warm-up
    runs["trl"] = trl_peer.run()
  else:
    for i in range(args.steps):
      one_round(i)
  return {"cols": {name: medians(r) for name, r in runs.items()}, "compile": compile_s,
          "model_cfg": model_cfg}


def print_length(new_tokens: int, result: dict, peak: float):
  cols, cfg = result["cols"], result["model_cfg"]
  names = list(cols)
  first = names[0]
  peers = [n for n in names if not n.startswith("rljax")]
  print(f"\n## {new_tokens} new tokens ({PROMPTS} x {GROUP} rows of {PROMPT_LEN + new_tokens} "
        f"positions)")
  for b, c in result["compile"].items():
    print(f"rljax first step, {b} (compilation included): {c:.1f} s")
  head = "".join(f" {n:>14}" for n in names) + "".join(f" {p + '/' + first:>20}" for p in peers)
  print(f"{'phase':<8}{head}")
  for k in PHASES:
    row = "".join(f" {cols[n][k]:>14.4f}" for n in names)
    row += "".join(f" {cols[p][k] / cols[first][k]:>19.2f}x" for p in peers)
    print(f"{k:<8}{row}")
  flops = update_flops(cfg, new_tokens)
  row = "".join(f" {flops / cols[n]['update'] / 1e9:>14.1f}" for n in names)
  print(f"{'GFLOP/s':<8}{row}   (update: {flops / 1e9:.1f} GFLOP)")
  row = "".join(f" {100 * flops / cols[n]['update'] / peak:>13.1f}%" for n in names)
  print(f"{'% peak':<8}{row}")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--new-tokens", default="16", help="comma list of lengths")
  parser.add_argument("--rljax", default="default",
                      help="';'-separated columns of config overrides (k=v,k2=v2 or default), "
                           "e.g. 'default;model.forward_tokens=0'")
  parser.add_argument("--peers", default="torch,trl",
                      help="comma list of torch, trl (trl: where installed, CPU only)")
  args = parser.parse_args()
  columns = args.rljax.split(";")
  lengths = [int(n) for n in args.new_tokens.split(",")]
  devices = start_devices(columns, lengths[0])
  import torch
  threads = len(os.sched_getaffinity(0))  # the cores this process may use (taskset)
  torch.set_num_threads(threads)
  gpu = jax.default_backend() == "gpu"
  if gpu and not torch.cuda.is_available():
    raise SystemExit("JAX sees a GPU but torch.cuda does not: the peer would run on the CPU")
  peers = [p for p in args.peers.split(",") if p]
  if "trl" in peers and (gpu or not trl_available()):
    print(f"# trl peer skipped: {'GPU run' if gpu else 'trl is not installed (bench extra)'}")
    peers.remove("trl")
  flops = matmul_flops(gpu=gpu)
  peak = max(flops.values())
  if gpu:
    device = jax.devices()[0]
    where = (f"1 GPU: {device.device_kind} (torch: {torch.cuda.get_device_name(0)}, CUDA "
             f"{torch.version.cuda})")
  else:
    where = (f"{threads} CPU threads (of {os.cpu_count()} cores); rljax on {devices} CPU "
             "device(s) (mesh.cpu_devices, as `rljax train`)")
  versions = f"jax {jax.__version__}, torch {torch.__version__}"
  if "trl" in peers:
    import transformers
    import trl
    versions += f", transformers {transformers.__version__}, trl {trl.__version__}"
  print(f"# {versions}; {where}")
  print(f"# float32 2048^3 matmul: XLA {flops['xla'] / 1e9:.0f} GFLOP/s, torch "
        f"{flops['torch'] / 1e9:.0f} GFLOP/s -> peak {peak / 1e9:.0f} GFLOP/s")
  for n in lengths:
    result = measure(n, args, columns, peers, gpu)
    if n == lengths[0]:
      print(f"# model: {result['model_cfg'].num_params():,} params")
    print_length(n, result, peak)
    sys.stdout.flush()
  if gpu:
    device = jax.devices()[0]
    peak_mem = (device.memory_stats() or {}).get("peak_bytes_in_use")
    jax_mb = "n/a" if peak_mem is None else f"{peak_mem / 2 ** 20:.1f} MB"
    print(f"matmul precision: {matmul_precisions(torch)}")
    print(f"peak device memory: jax {jax_mb} (peak bytes in use), torch "
          f"{torch.cuda.max_memory_allocated() / 2 ** 20:.1f} MB (max allocated)")


if __name__ == "__main__":
  main()
