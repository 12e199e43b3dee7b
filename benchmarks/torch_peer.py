"""The PyTorch peer of ``benchmarks/accelerator.py``: rljax's GRPO update in transformers + SDPA.

A ``transformers`` ``AutoModelForCausalLM`` of the same architecture (``ModelConfig.to_hf_dict``)
with SDPA attention, float32 parameters under ``torch.autocast(bfloat16)`` (rljax's precision
policy), the logits of the completion positions only (``logits_to_keep``), the loss of
``configs/algos/grpo.py`` (clipped ratio against the detached log-probs, so 1 as in rljax's single
update per batch; k3 KL to given reference log-probs with weight 0.04; sequence-mean-token-mean),
gradient clipping at norm 1 and fused AdamW. Gradient checkpointing only where it runs out of
memory without.
"""
import gc
import statistics

from bench_common import timed

GiB = 2 ** 30


def missing() -> str | None:
  """Why the peer cannot run here (None: it can)."""
  try:
    import torch
    import transformers  # noqa: F401
  except ImportError as e:
    return f"not installed ({e})"
  if not torch.cuda.is_available():
    return "torch has no CUDA device"
  return None


def model(cfg, checkpointing: bool, device: str = "cuda"):
  import torch
  import transformers
  hf = cfg.to_hf_dict()
  hf_config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
  with torch.device(device):
    net = transformers.AutoModelForCausalLM.from_config(
        hf_config, attn_implementation="sdpa", dtype=torch.float32)
  if checkpointing:  # renamed in transformers 5.2x; the old name still works there
    enable = getattr(net, "activation_checkpointing_enable", None)
    (enable or net.gradient_checkpointing_enable)()
  net.train()
  return net


def update_fn(net, cfg, rows: int, seq: int, completion: int, device: str = "cuda"):
  """One update of ``net`` on random ``[rows, seq]`` tokens, the last ``completion`` scored."""
  import torch
  gen = torch.Generator(device=device).manual_seed(0)
  tokens = torch.randint(3, cfg.vocab_size, (rows, seq), device=device, generator=gen)
  targets = tokens[:, seq - completion:]
  advantages = torch.randn(rows, 1, device=device, generator=gen)
  ref_logp = -torch.rand(rows, completion, device=device, generator=gen) - 11.0
  opt = torch.optim.AdamW(net.parameters(), lr=1e-6, weight_decay=0.0, fused=True)
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

  def step():
    with torch.autocast(device, dtype=torch.bfloat16):
      logits = net(tokens, use_cache=False, logits_to_keep=completion + 1).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]
    ratio = torch.exp(logp - logp.detach())
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2))
    x = (ref_logp - logp).clamp(-20, 20)
    loss = (pg + 0.04 * (torch.exp(x) - x - 1)).mean(1).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    sync()

  return step


def release() -> None:
  import torch
  gc.collect()
  torch.cuda.empty_cache()


def attempt(cfg, rows: int, seq: int, completion: int, steps: int,
            checkpointing: bool) -> dict | None:
  """{'ms', 'note'}: the median of ``steps`` updates after a first one; None if CUDA runs out of
  memory (returning drops the traceback, and with it the tensors its frames hold)."""
  import torch
  torch.cuda.reset_peak_memory_stats()
  try:
    step = update_fn(model(cfg, checkpointing), cfg, rows, seq, completion)
    _, times = timed(step, steps)
  except torch.cuda.OutOfMemoryError:
    return None
  variant = "gradient checkpointing" if checkpointing else "no checkpointing"
  return {"ms": 1e3 * statistics.median(times),
          "note": f"{variant}, peak {torch.cuda.max_memory_allocated() / GiB:.3g} GiB"}


def measure(cfg, rows: int, seq: int, completion: int, steps: int) -> dict:
  """``attempt`` without gradient checkpointing, then with it where that ran out of memory."""
  for checkpointing in (False, True):
    result = attempt(cfg, rows, seq, completion, steps, checkpointing)
    release()
    if result is not None:
      return result
  return {"ms": None, "note": "out of memory, with gradient checkpointing too"}
