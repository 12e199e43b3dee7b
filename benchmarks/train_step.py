"""One GRPO step (sample -> score -> update) of rljax against a PyTorch/transformers peer.

  python benchmarks/train_step.py [--steps 10] [--new-tokens 16]

Both sides, in this one process and on the same CPU threads: a ~0.8M-parameter Llama (hidden 128,
4 layers, vocab 48), 8 prompts x 8 completions, prompts of 8 tokens, exactly ``--new-tokens``
sampled tokens (no early stop), then old/ref log-probs, a clipped GRPO loss with k3 KL, backward
and AdamW. Rewards are random (verifiers are Python on both sides and not what is measured).
Prints seconds per phase (median over steps after a warm-up), the compile time of rljax's first
step, and the ratio peer / rljax.

Where JAX's default backend is a GPU, rljax runs on one GPU and the peer on torch CUDA (every phase
synchronised before its clock stops), and the GPU, the matmul precisions (XLA may use TF32 for
float32 dots, torch does not unless ``allow_tf32`` is set) and both peak device memories are
printed too.
"""
import argparse
import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rljax import config_loader  # noqa: E402
from rljax.models import tiny_config, llama  # noqa: E402
from rljax.parallel import mesh as mesh_lib  # noqa: E402
from rljax.rollout import SamplingParams, make_sampler  # noqa: E402
from rljax.train import build  # noqa: E402
from bench_common import matmul_precisions  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, PROMPTS, GROUP, PROMPT_LEN = 48, 8, 8, 8


def rljax_step_fn(new_tokens: int):
  config = config_loader.load_config(os.path.join(ROOT, "configs", "grpo.py"), [
      ("rollout.prompts_per_step", str(PROMPTS)), ("rollout.group_size", str(GROUP)),
      ("rollout.max_new_tokens", str(new_tokens)), ("data.prompt_bucket", str(PROMPT_LEN))])
  model_cfg = tiny_config(config.model, VOCAB)
  params = llama.init_params(model_cfg, seed=0)
  state, fns, _ = build.sharded_state_and_fns(config, model_cfg, params,
                                              mesh_lib.make_mesh(config.mesh))
  # stop_ids=() : exactly new_tokens tokens, as the peer is forced to generate.
  sp = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, greedy=False,
                      max_new_tokens=new_tokens, stop_ids=(), pad_id=0)
  sampler = make_sampler(model_cfg, sp, GROUP)
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, VOCAB, (PROMPTS, PROMPT_LEN)).astype(np.int32)
  prompt_mask = np.ones_like(prompts)
  holder = {"state": state}

  def step(i):
    times = {}
    t0 = time.perf_counter()
    out = sampler(holder["state"].params, prompts, prompt_mask, jax.random.PRNGKey(i))
    out = jax.device_get(out)
    t1 = time.perf_counter()
    rewards = np.random.default_rng(i).integers(0, 2, PROMPTS * GROUP).astype(np.float32)
    tokens = np.concatenate([out.prompt_tokens, out.tokens], 1)
    attn = np.concatenate([out.prompt_mask, out.mask], 1).astype(np.int32)
    batch, _ = fns.prepare_batch(holder["state"], tokens, attn, out.mask.astype(np.float32),
                                 out.sampler_logp, rewards, np.zeros_like(rewards),
                                 np.ones_like(rewards))
    holder["state"], metrics = fns.train_step(holder["state"], batch)
    jax.block_until_ready(jax.device_get(metrics))
    t2 = time.perf_counter()
    times.update(rollout=t1 - t0, update=t2 - t1, step=t2 - t0)
    return times

  return step, model_cfg


def torch_step_fn(new_tokens: int, model_cfg, device: str = "cpu"):
  import copy

  import torch
  import transformers
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  torch.manual_seed(0)
  hf = transformers.LlamaConfig(
      vocab_size=VOCAB, hidden_size=model_cfg.hidden_size,
      intermediate_size=model_cfg.intermediate_size, num_hidden_layers=model_cfg.num_layers,
      num_attention_heads=model_cfg.num_heads, num_key_value_heads=model_cfg.num_kv_heads,
      tie_word_embeddings=model_cfg.tie_embeddings, pad_token_id=0, eos_token_id=1,
      bos_token_id=2)
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
    t2 = time.perf_counter()
    return {"rollout": t1 - t0, "update": t2 - t1, "step": t2 - t0}

  return step


def median_times(step, steps):
  runs = [step(i) for i in range(steps)]
  return {k: statistics.median(r[k] for r in runs) for k in runs[0]}, runs


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--new-tokens", type=int, default=16)
  args = parser.parse_args()
  import torch
  torch.set_num_threads(os.cpu_count())
  gpu = jax.default_backend() == "gpu"
  if gpu and not torch.cuda.is_available():
    raise SystemExit("JAX sees a GPU but torch.cuda does not: the peer would run on the CPU")
  ours, model_cfg = rljax_step_fn(args.new_tokens)
  t = time.perf_counter()
  ours(10_000)  # compile
  compile_s = time.perf_counter() - t
  peer = torch_step_fn(args.new_tokens, model_cfg, "cuda" if gpu else "cpu")
  peer(10_000)  # warm-up
  ours_med, _ = median_times(ours, args.steps)
  peer_med, _ = median_times(peer, args.steps)
  if gpu:
    device = jax.devices()[0]
    where = (f"1 GPU: {device.device_kind} (torch: {torch.cuda.get_device_name(0)}, CUDA "
             f"{torch.version.cuda})")
  else:
    where = f"{os.cpu_count()} CPU threads"
  print(f"model: {model_cfg.num_params():,} params; {PROMPTS} prompts x {GROUP} completions x "
        f"{args.new_tokens} new tokens; jax {jax.__version__}, torch {torch.__version__}, "
        f"{where}")
  if gpu:
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use")
    jax_mb = "n/a" if peak is None else f"{peak / 2 ** 20:.1f} MB"
    print(f"matmul precision: {matmul_precisions(torch)}")
    print(f"peak device memory: jax {jax_mb} (peak bytes in use), torch "
          f"{torch.cuda.max_memory_allocated() / 2 ** 20:.1f} MB (max allocated)")
  print(f"rljax first step (compilation included): {compile_s:.1f} s")
  print(f"{'phase':<8} {'rljax s':>9} {'torch s':>9} {'torch/rljax':>12}")
  for k in ("rollout", "update", "step"):
    print(f"{k:<8} {ours_med[k]:>9.4f} {peer_med[k]:>9.4f} {peer_med[k] / ours_med[k]:>11.2f}x")


if __name__ == "__main__":
  main()
