"""``rljax plan``: per-device figures for Qwen2.5-7B checked against hand-computed numbers."""
import importlib.util
import json
import os

import pytest

from rljax.config import loader as config_loader
from rljax import plan as plan_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GiB = 1024 ** 3
QWEN7B = 7_615_616_512  # parameters of Qwen2.5-7B (untied, qkv bias)
# Replicated when tensor=1: 57 RMSNorm scales of 3584 and 28 layers of q/k/v biases (3584+2*512).
QWEN7B_SMALL = 57 * 3584 + 28 * (3584 + 2 * 512)


def fsdp_bytes(n, nbytes=2):
  """Hand count: matrices split n ways, norms and biases replicated."""
  return (QWEN7B - QWEN7B_SMALL) * nbytes // n + QWEN7B_SMALL * nbytes


def load(name):
  path = os.path.join(REPO, "configs", "jobs", f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def close(a, b, rel=0.01):
  return abs(a - b) <= rel * abs(b)


@pytest.mark.parametrize("name,params", [("qwen2.5-7b", QWEN7B), ("qwen2.5-0.5b", 494_032_768),
                                         ("llama3-8b", 8_030_261_248)])
def test_shape_table_parameter_counts(name, params):
  _, cfg = plan_lib.model_config(load("qwen7b_v5p64"), name)
  assert cfg.num_params() == params


@pytest.mark.parametrize("spec,kind,count,mem", [
    ("v5p-64", "v5p", 32, 95 * GiB),  # 64 TensorCores = 32 chips
    ("v5p-128", "v5p", 64, 95 * GiB),
    ("v4-32", "v4", 16, 32 * GiB),
    ("v5e-16", "v5e", 16, 16 * GiB),
    ("8xh100-80g", "h100-80g", 8, 81559 * 2 ** 20),
    ("16xa100-80g", "a100-80g", 16, 80 * GiB),
    ("h100-80g", "h100-80g", None, 81559 * 2 ** 20),
    ("8x80GB", "80gb", 8, 80 * 10 ** 9),
    ("h100-80g:70GiB", "h100-80g", None, 70 * GiB),
])
def test_parse_device(spec, kind, count, mem):
  d = plan_lib.parse_device(spec)
  assert (d["kind"], d["count"], d["bytes"]) == (kind, count, mem)


def test_parse_device_unknown():
  with pytest.raises(ValueError, match="unknown device 'tpu9'"):
    plan_lib.parse_device("tpu9")


def kv_bytes(rows, slots, layers=28, kv=4, dh=128, nbytes=2):
  return 2 * layers * rows * slots * kv * dh * nbytes


def test_qwen7b_v5p64():
  c = load("qwen7b_v5p64")
  p = plan_lib.plan(c)
  assert p["mesh"] == {"data": 1, "fsdp": 32, "expert": 1, "context": 1, "tensor": 1}
  assert p["device"]["count"] == 32 and p["device"]["hosts"] == 8
  by = p["bytes"]
  # bf16 params split 32 ways: 7.6e9 * 2 / 32 = 0.476 GB (+0.6 MB of replicated norms/biases).
  assert by["params"] == fsdp_bytes(32)
  assert close(by["params"], QWEN7B * 2 / 32, 0.002)
  assert close(by["opt_state"], 2 * by["params"], 0.001)  # AdamW mu + nu in bf16
  assert by["reference"] == by["params"]
  assert by["critic"] == 0
  assert by["kv_cache"] == kv_bytes(512 // 32, 1024 + 4096)
  assert p["shapes"]["train_rows_per_device"] == 1
  assert p["fallbacks"] == []
  assert p["fits"] and p["peak"] < 40 * GiB
  # On TPUs model.attention='auto' is Pallas flash attention: no T^2 term, per layer per token
  # the decoder's tensors + attention output and log-sum-exp (28 heads x (128 bf16 + 4 bytes)).
  assert p["model"]["attention"] == "pallas"
  per_token_layer = (10 * 3584 + 2 * (3584 + 2 * 512) + 4 * 18944) * 2 + 28 * (128 * 2 + 4)
  assert by["activations_no_remat"] == 28 * 5120 * per_token_layer
  assert by["activations_remat"] < by["activations_dots"] < by["activations_no_remat"]
  c.model.attention = "xla"  # materialised [H, S, S] scores per layer
  by_xla = plan_lib.plan(c)["bytes"]
  assert by_xla["activations_no_remat"] > 95 * GiB > by_xla["activations_remat"]


def test_a_speculative_draft_adds_its_verification_positions_to_the_cache_only():
  """k drafted tokens are verified by a forward of k + 1 positions past the last one emitted:
  each row's cache holds them (rljax.rollout.spec_decode); the trained rows do not."""
  c = load("qwen7b_v5p64")
  c.rollout.draft, c.rollout.draft_tokens = "ngram", 4
  p = plan_lib.plan(c)
  assert p["bytes"]["kv_cache"] == kv_bytes(512 // 32, 1024 + 4096 + 5)
  assert p["shapes"]["cache_slots"] == 1024 + 4096 + 5 and p["shapes"]["train_seq"] == 1024 + 4096


def test_qwen7b_128k_on_v5p64_fits_only_with_the_context_axis():
  """128k-token rows: one row of activations per chip is 85 GiB (remat full), so one chip per
  row does not fit; split over context=8 it is 1/8 of it, the KV cache 1/8 of its slots."""
  c = load("qwen7b_v5p64_128k")
  p = plan_lib.plan(c)
  assert p["mesh"] == {"data": 1, "fsdp": 4, "expert": 1, "context": 8, "tensor": 1}
  by, shapes = p["bytes"], p["shapes"]
  assert shapes["train_rows_per_device"] == 1 and shapes["train_seq_per_device"] == 131072 // 8
  assert by["kv_cache"] == kv_bytes(64 // 4, 131072) // 8
  assert by["params"] == fsdp_bytes(32)  # the weights over fsdp x context
  assert p["model"]["attention"] == "blockwise"  # the ring's kernel, not Pallas
  assert p["fits"] and p["peak"] < 45 * GiB
  # What each chip sends per micro-batch, by hand: one chip's k (or v) piece is 16384 tokens x
  # 4 kv heads x 128 = 2^23 bf16 values; per layer the forward passes 7 pieces of k and v
  # (twice: remat recomputes it), the backward 8 with their float32 gradients.
  piece = 16384 * 4 * 128
  per_layer = 2 * (7 * 2 * piece * 2) + 8 * 2 * piece * (2 + 4)
  assert by["ring_transfers"] == 28 * per_layer
  assert "ring (context=8): each device sends 33.25 GiB" in plan_lib.format_plan(p)
  c.mesh.context, c.mesh.fsdp = 1, 32
  alone = plan_lib.plan(c)
  assert not alone["fits"] and alone["bytes"]["activations"] > 80 * GiB
  # Activations scale with the tokens a chip holds (the blockwise tiles are a fixed few MiB).
  assert close(by["activations"], alone["bytes"]["activations"] / 8, 0.01)


def test_qwen32b_64k_on_v5p64_fits_with_context_and_tensor():
  p = plan_lib.plan(load("qwen32b_v5p64_64k"))
  assert p["mesh"] == {"data": 1, "fsdp": 2, "expert": 1, "context": 8, "tensor": 2}
  assert p["model"]["num_params"] > 32e9 and p["fits"], plan_lib.format_plan(p)
  assert p["bytes"]["kv_cache"] == kv_bytes(32 // 2, 65536, layers=64, kv=8) // 8 // 2


def test_qwen7b_v5p128_fsdp64():
  c = load("qwen7b_v5p64")
  p = plan_lib.plan(c, "v5p-128")
  assert p["mesh"]["fsdp"] == 64
  assert p["bytes"]["params"] == fsdp_bytes(64)
  assert close(p["bytes"]["params"], QWEN7B * 2 / 64, 0.003)


def test_qwen7b_8xh100():
  c = load("qwen7b_8xh100")
  p = plan_lib.plan(c)
  assert p["mesh"] == {"data": 1, "fsdp": 8, "expert": 1, "context": 1, "tensor": 1}
  by = p["bytes"]
  assert by["params"] == fsdp_bytes(8)  # 1.9 GB
  assert close(by["opt_state"], QWEN7B * 4 / 8, 0.001)
  assert by["kv_cache"] == kv_bytes(256 // 8, 1024 + 3072)
  assert close(by["gradients"], 2 * by["params"], 0.001)  # micro_batches > 1: acc + current
  assert p["fits"] and p["peak"] < 60 * GiB
  report = plan_lib.plan_main(c)
  assert "data=1 fsdp=8 expert=1 context=1 tensor=1" in report and "FITS" in report
  json.dumps(p)  # plain data


def test_moe_expert_weights_split_over_the_expert_axis():
  """Qwen3-30B-A3B on 8 x H100 with expert=8: its 29.0B expert parameters split 8 ways, the other
  1.5B (attention, router, embeddings, norms) replicated; the sampler gathers all experts."""
  c = load("qwen7b_8xh100")
  c.mesh.data, c.mesh.fsdp, c.mesh.expert, c.mesh.tensor = 1, 1, 8, 1
  p = plan_lib.plan(c, model="qwen3-30b-a3b")
  experts = 48 * 128 * 3 * 2048 * 768  # layers x E x (gate, up, down) x D x F
  total = 30_532_122_624  # Qwen3-30B-A3B's parameters (its q/k norms included)
  by = p["bytes"]
  assert p["mesh"] == {"data": 1, "fsdp": 1, "expert": 8, "context": 1, "tensor": 1}
  assert by["params"] == 2 * (experts // 8 + total - experts)  # bf16
  assert close(by["opt_state"], 2 * by["params"], 0.001)
  assert by["rollout_gathered_weights"] == 2 * experts
  assert p["batch_shards"] == 8 and p["fallbacks"] == []
  report = plan_lib.format_plan(p)
  assert "mesh    data=1 fsdp=1 expert=8 context=1 tensor=1; batch rows split 8 ways" in report
  assert "E=128 k=8 Fe=768 (48 MoE layers)" in report
  assert "expert-split weights" in report and "48 MoE layers: activations" in report


def test_critic_tensor_parallel_and_no_reference():
  c = load("qwen7b_8xh100")
  c.critic.enabled = True
  c.algo.kl_placement = "none"
  c.mesh.fsdp = 4
  c.mesh.tensor = 2
  c.mesh.data = 1
  p = plan_lib.plan(c)
  by = p["bytes"]
  assert by["reference"] == 0 and "kl_placement='none'" in plan_lib.format_plan(p)
  # The critic drops the 545M-parameter LM head and adds a [D, 1] value head.
  head = 152064 * 3584
  assert close(by["critic"], (QWEN7B - head) * 2 / 8, 0.002)
  assert close(by["critic_opt_state"], 2 * by["critic"], 0.002)
  # 4 kv heads split over tensor=2 in the cache.
  assert p["shapes"]["kv_heads_per_device"] == 2
  assert by["kv_cache"] == kv_bytes(256 // 4, 4096, kv=2)


def test_fallbacks_are_reported():
  c = load("qwen7b_8xh100")
  c.mesh.fsdp = 1
  c.mesh.tensor = 8  # 4 kv heads cannot split 8 ways in the cache; weights' 512-wide k/v can
  p = plan_lib.plan(c)
  assert any(f.startswith("kv cache dim 1 (kv_heads=4)") for f in p["fallbacks"])
  assert "kv cache dim 1" in plan_lib.format_plan(p)


def test_device_count_must_be_known():
  c = load("qwen7b_8xh100")
  with pytest.raises(ValueError, match="does not say how many devices"):
    plan_lib.plan(c, "h100-80g")
  c.mesh.fsdp = 8
  assert plan_lib.plan(c, "h100-80g")["device"]["count"] == 8


def test_scan_layers_counts_stacked_weights_and_its_activations():
  """``model.scan_layers``: the stacked copy of the layer weights and of their gradient, per
  device (hand count: Qwen2.5-7B without embedding, lm head and final norm, bf16, FSDP over
  the v5p-64 plan's devices), and one layer's backward live instead of two with remat."""
  c = load("qwen7b_v5p64")
  base = plan_lib.plan(c)
  c.model.scan_layers = True
  p = plan_lib.plan(c)
  outer = 2 * 152064 * 3584 + 3584  # embed_tokens, lm_head, final norm
  layers_total = QWEN7B - outer
  layers_small = QWEN7B_SMALL - 3584  # the replicated norm scales and biases inside the layers
  n = p["mesh"]["fsdp"] * p["mesh"]["tensor"]
  want = 2 * ((layers_total - layers_small) * 2 // n + layers_small * 2)
  assert close(p["bytes"]["scan_stacked_weights"], want, 0.001), (p["bytes"], want)
  assert base["bytes"]["scan_stacked_weights"] == 0
  assert p["train"] - base["train"] == (p["bytes"]["scan_stacked_weights"]
                                        + p["bytes"]["activations"] - base["bytes"]["activations"])
  layer_act = base["bytes"]["activations_no_remat"] // 28
  by, base_by = p["bytes"], base["bytes"]
  assert close(by["activations_remat"], base_by["activations_remat"]
               - (plan_lib.REMAT_LIVE_LAYERS - plan_lib.SCAN_LIVE_LAYERS) * layer_act, 0.001)
  assert close(by["activations_no_remat"],
               base_by["activations_no_remat"] + plan_lib.SCAN_LIVE_LAYERS * layer_act, 0.001)


def test_the_main_jobs_sft_cold_start_plans_as_its_tiny_architecture(capsys):
  """``model.source='sft'`` (the main job) is the config's tiny architecture trained first: the
  plan counts 4 layers of D=128, F=384, H=4/G=2 over the char vocabulary (57 tokens, tied),
  and a source it cannot plan is a one-line error of the CLI naming it."""
  from rljax import cli
  from rljax.config import loader as config_loader
  config = config_loader.load_config(os.path.join(REPO, "configs", "jobs", "main.py"))
  name, cfg = plan_lib.model_config(config)
  d, f, layers, vocab = 128, 384, 4, 57
  per_layer = d * d + 2 * d * 64 + d * d + 3 * d * f + 2 * d  # q, k+v (G*Dh=64), o, MLP, norms
  assert name == "sft" and cfg.num_params() == layers * per_layer + vocab * d + d
  with pytest.raises(SystemExit, match=r"^error: cannot plan for model 'nope'"):
    cli.entry(["plan", "--config", os.path.join(REPO, "configs", "jobs", "main.py"),
               "--device", "cpu", "--config.model.source=nope"])


def test_sampler_on_its_own_devices_plans_both_meshes():
  """8 H100s as 4 learner (FSDP) + 4 sampler (data-parallel) devices, asynchronous: the learner's
  devices hold the FSDP-4 state and no rollout; each sampler device holds two full bf16 copies of
  the weights (the newest published and the one in use) and its share of the KV cache."""
  c = load("qwen7b_8xh100")
  with c.unlocked():
    c.mesh.sampler_devices, c.rollout.max_staleness = 4, 1
  p = plan_lib.plan(c)
  assert p["mesh"] == {"data": 1, "fsdp": 4, "expert": 1, "context": 1, "tensor": 1}
  assert p["bytes"]["params"] == fsdp_bytes(4)
  assert p["peak"] == p["resident"] + p["train"]  # the rollout runs elsewhere
  s = p["sampler"]
  assert s["devices"] == 4 and s["mesh"]["data"] == 4
  assert s["weights"] == 2 * QWEN7B * 2
  assert s["kv_cache"] == kv_bytes(256 // 4, 1024 + 3072)
  assert s["peak"] == s["weights"] + s["rollout"]
  assert p["fits"] == (p["peak"] <= p["device"]["usable"] and s["fits"])
  assert "sampler devices (4" in plan_lib.plan_main(c)
  colocated = load("qwen7b_8xh100")
  base = plan_lib.plan(colocated)
  with colocated.unlocked():
    colocated.rollout.max_staleness = 1
  p = plan_lib.plan(colocated)  # two copies of the sharded weights beside the state
  assert p["resident"] == base["resident"] + 2 * base["bytes"]["params"]


def test_lora_7b_on_one_h100_against_a_hand_count():
  """configs/jobs/qwen7b_lora_1xh100.py: adapters of rank r on the 7 projections of the 28
  layers hold r * (A's inputs + B's outputs) = r * 90112 per layer in float32, AdamW's mu and nu
  as much again each, gradients two copies (16 micro-batches); the base is bfloat16 (2 bytes a
  parameter) with no reference copy; the rollout holds the 28 layers' merged kernels in bfloat16.
  It fits one 80 GB H100 with adapters and does not as a full fine-tune."""
  config = load("qwen7b_lora_1xh100")
  d, q, kv, f, layers = 3584, 3584, 512, 18944, 28
  per_layer = (d + q) + 2 * (d + kv) + (q + d) + 2 * (d + f) + (f + d)
  assert per_layer == 90112
  for rank in (64,):
    with config.unlocked():
      config.model.lora.rank = rank
    p = plan_lib.plan(config)
    adapters = 4 * rank * per_layer * layers
    by = p["bytes"]
    assert p["model"]["adapter_params"] == rank * per_layer * layers
    assert by["adapters"] == adapters
    assert by["params"] == 2 * QWEN7B + adapters
    assert close(by["opt_state"], 2 * adapters, rel=1e-6)  # + the scalar counts
    assert by["gradients"] == 2 * adapters and by["reference"] == 0
    kernels = layers * (d * q + 2 * d * kv + q * d + 3 * d * f)
    assert by["merged_weights"] == 2 * kernels
    assert p["fits"], plan_lib.format_plan(p)
  with config.unlocked():
    config.model.lora.rank = 0
    config.model.lora.base_dtype = "param"
  full = plan_lib.plan(config)
  assert full["bytes"]["reference"] == full["bytes"]["params"] == 4 * QWEN7B
  assert full["bytes"]["merged_weights"] == 0 and not full["fits"]


def test_the_packed_update_counts_its_chunk_rows():
  """``model.pack``: 64 rows of 64 + 128 = 192 tokens, 1024 tokens a chunk, one CPU device. Packed
  (auto: 13 chunks >= 2): chunks of 1024 // 192 = 5 rows; padded: the smallest divisor k of 64
  with 64 / k <= 1024 / 192 rows, k = 16 parts of 4 rows. The activations, block temporaries
  and log-prob chunk scale with the rows: packed = 5/4 x padded."""
  overrides = {"rollout.prompts_per_step": "16", "rollout.group_size": "4",
               "data.prompt_bucket": "64", "rollout.max_new_tokens": "128",
               "model.forward_tokens": "1024", "model.parallel_chunks": "1",
               "algo.minibatches": "1", "algo.micro_batches": "1"}
  plans = {}
  for pack in ("auto", "False"):
    config = config_loader.load_config(os.path.join(REPO, "configs", "algos", "grpo.py"),
                                       list({**overrides, "model.pack": pack}.items()))
    plans[pack] = plan_lib.plan(config, "cpu")
  packed, padded = plans["auto"], plans["False"]
  assert packed["shapes"]["train_rows_per_device"] == 5
  assert padded["shapes"]["train_rows_per_device"] == 4
  for name in ("activations_no_remat", "activations_remat", "logits"):
    assert packed["bytes"][name] * 4 == padded["bytes"][name] * 5, name
  assert any("13 chunks" in a for a in packed["assumptions"])


# --- the reward's models: the reward model and the LLM judge --------------------------------------

def _reward_config(**reward):
  """The tiny GRPO run on CPU, float32, with ``reward.*`` overrides."""
  from tests.train import tiny
  overrides = dict(tiny.OVERRIDES, **{"model.dtype": "float32"}, **reward)
  return config_loader.load_config(os.path.join(REPO, "configs", "algos", "grpo.py"),
                                   list(overrides.items()))


def test_the_reward_model_and_the_judge_are_counted_and_their_sources_checked(tmp_path):
  """Was: neither counted, and FITS with sources that do not exist. The reward model's weights
  (one device: all of them) are the bytes of its safetensors tensors; the judge ('policy': the
  policy's architecture, unsharded) holds a KV cache 2 x L x B x K x G x Dh x 4 over every row
  of a round, K = the template's bytes + prompt + completion + its verdict."""
  from safetensors.numpy import load_file
  from rljax.errors import ModelFileError
  from tests import hf_models
  base = plan_lib.plan(_reward_config(), "cpu")
  path = hf_models.build_reward_model("llama", str(tmp_path / "rm"))
  rm_bytes = sum(a.nbytes for a in load_file(os.path.join(path, "model.safetensors")).values())
  p = plan_lib.plan(_reward_config(**{"reward.sources": "verifier:1,rm:0.5,judge:0.5",
                                      "reward.model.source": f"hf:{path}",
                                      "reward.model.tokenizer": "char"}), "cpu")
  assert p["bytes"]["reward_model_params"] == rm_bytes
  assert p["bytes"]["judge_params"] == base["bytes"]["params"]  # unsharded: all of them
  _, cfg = plan_lib.model_config(_reward_config(), device_kind="cpu")
  template = "question: {prompt}\nanswer: {completion}\nscore: "
  slots = len(template) + 8 + 8 + 8  # prompt_bucket, rollout.max_new_tokens, judge verdict
  rows = 2 * 4
  assert p["bytes"]["judge_phase"] == 2 * cfg.num_layers * rows * slots * cfg.num_kv_heads \
      * cfg.head_dim * 4
  assert p["resident"] == base["resident"] + rm_bytes + base["bytes"]["params"]
  assert p["peak"] == p["resident"] + max(p["rollout"], p["train"], p["reward"])
  report = plan_lib.format_plan(p)
  assert "reward model params (reward.model.source)" in report and "judge params" in report
  for key, value in (("reward.model.source", "hf:/no/such/rm"),
                     ("reward.judge.source", "hf:/no/such/judge")):
    sources = {"reward.sources": "verifier:1,rm:0.5,judge:0.5",
               "reward.model.source": f"hf:{path}", "reward.model.tokenizer": "char", key: value}
    with pytest.raises(ModelFileError, match=f"{key}='{value}'"):
      plan_lib.plan(_reward_config(**sources), "cpu")
