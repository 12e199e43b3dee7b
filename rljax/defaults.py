"""The default configuration: every key of ALGORITHMS.md with its default.

``rljax.config()`` returns it; ``configs/base.py`` re-exports it for the presets
(``configs/<algo>.py``), which change only what makes them that algorithm. Override anything on
the command line with ``--config.section.key=value``.
"""
import ml_collections
from ml_collections.config_dict import placeholder


def get_config():
  c = ml_collections.ConfigDict()
  c.seed = 0

  # --- model -----------------------------------------------------------------------------------
  c.model = ml_collections.ConfigDict()
  # 'tiny': a fresh random model with the sizes below; 'hf:PATH': a Hugging Face directory;
  # 'sft': the supervised cold start of section `sft` (trained first if not on disk yet).
  c.model.source = "tiny"
  c.model.hidden_size = 128
  c.model.intermediate_size = 384
  c.model.num_layers = 4
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.rope_theta = 10000.0
  c.model.tie_embeddings = True
  c.model.dtype = "float32"  # compute dtype: bfloat16 on accelerators
  c.model.param_dtype = "float32"
  # per-layer rematerialisation in the backward pass: none | full (keep each layer's input only)
  # | dots (also keep the weight matmuls' outputs); True/False read as full/none
  c.model.remat = "none"
  # training/scoring forward as a lax.scan over the layers (same parameter tree); remat saves
  # memory on XLA:CPU only with it (the unrolled loop's recomputation is merged into the forward)
  c.model.scan_layers = False
  # attention backend: auto (cudnn on GPUs for 16-bit dtypes, pallas on TPUs, else blockwise) |
  # xla (materialised scores, the reference) | blockwise | cudnn | pallas
  c.model.attention = "auto"
  c.model.attention_block = 128  # max query/key block of the blockwise attention (balanced)
  # float32 matmul precision of the run: default (JAX's: TF32 on GPUs, bfloat16 passes on TPUs) |
  # high | highest (float32 parity with transformers on an accelerator; no effect on CPU or bf16)
  c.model.matmul_precision = "default"
  c.model.logits_chunk = 512  # sequence chunk for log-prob/entropy (never [B, T, V] at once)
  # most tokens per data shard in one forward/backward of the train step's scoring and update:
  # rows go through in chunks (exact accumulation); -1 = auto (1024 per CPU thread, where a chunk
  # that stays in cache is faster; no limit on accelerators), 0 = no limit
  c.model.forward_tokens = -1

  # --- data ------------------------------------------------------------------------------------
  c.data = ml_collections.ConfigDict()
  # 'embedded:arithmetic', 'embedded:countdown', 'jsonl:PATH', 'hf:PATH' (local datasets files)
  c.data.source = "embedded:arithmetic"
  c.data.difficulty = 1
  c.data.train_seed = 0
  c.data.eval_seed = 1
  c.data.num_eval = 256
  c.data.tokenizer = "char"  # 'char' or a local Hugging Face tokenizer directory
  c.data.chat_template = False
  c.data.prompt_bucket = 32  # prompts are left-padded to a multiple of this (fewer compilations)
  # Longest prompt in tokens; 0 = only the model's context (max_position_embeddings - new tokens)
  c.data.max_prompt_tokens = 0
  c.data.overlong_prompts = "error"  # a longer prompt: 'error' (names it) | 'drop' (counted)
  # a row with an empty prompt/answer, a NUL byte or a prompt given two answers: 'error' | 'drop'
  c.data.invalid_rows = "error"

  # --- rollout ---------------------------------------------------------------------------------
  c.rollout = ml_collections.ConfigDict()
  c.rollout.prompts_per_step = 8  # P
  c.rollout.group_size = 8  # G
  c.rollout.max_new_tokens = 64
  c.rollout.temperature = 1.0
  c.rollout.top_k = 0  # 0 = off
  c.rollout.top_p = 1.0
  c.rollout.min_p = 0.0
  c.rollout.max_concurrent_rows = 0  # slot budget S per data shard (continuous batching); 0 = all
  c.rollout.kv_cache_bytes = 0  # KV-cache budget per data shard, caps S too; 0 = no cap
  c.rollout.dtype = placeholder(str)  # sampler weights + KV cache dtype; None = model.dtype

  # --- reward (ALGORITHMS.md section 1) -------------------------------------------------------
  c.reward = ml_collections.ConfigDict()
  c.reward.fn = "exact_match"  # a name in rljax.rewards' registry
  c.reward.format_weight = 0.0  # optional format term added to correctness
  c.reward.wrong_value = 0.0  # reward of a wrong answer (0 or -1)
  c.reward.overlong_buffer = 0  # tokens; 0 = off
  c.reward.overlong_penalty = 1.0
  c.reward.timeout_s = 5.0  # per verifier call: a hard bound (the worker process is killed)
  c.reward.workers = 4  # verifier worker processes
  c.reward.max_logged_failures = 100  # failed calls sampled into run_dir/reward_failures.jsonl

  # --- algorithm (sections 2-5, 7) ------------------------------------------------------------
  c.algo = ml_collections.ConfigDict()
  c.algo.advantage = "grpo"
  c.algo.adv_std = "group"  # group | batch | none
  c.algo.adv_whiten = False
  c.algo.gamma = 1.0
  c.algo.lam = 0.95
  c.algo.lam_critic = placeholder(float)  # None = same as lam
  c.algo.lam_alpha = placeholder(float)  # None = off; VAPO 0.05

  c.algo.policy_loss = "ppo"
  c.algo.clip_eps_low = 0.2
  c.algo.clip_eps_high = 0.2
  c.algo.dual_clip_c = placeholder(float)
  c.algo.cispo_eps_high = 4.0
  c.algo.cispo_eps_low = placeholder(float)
  c.algo.gmpo_eps = 0.4

  c.algo.loss_agg = "seq_mean_token_mean"
  c.algo.loss_norm_constant = placeholder(float)  # None = max_new_tokens

  c.algo.kl_estimator = "k3"
  c.algo.kl_placement = "loss"  # loss | reward | none
  c.algo.kl_coef = 0.04
  c.algo.kl_target = placeholder(float)  # None = fixed coefficient
  c.algo.kl_horizon = 10000
  c.algo.ref_update = "frozen"  # frozen | ema
  c.algo.ref_ema_decay = 0.99
  c.algo.kl_normalize = False
  c.algo.entropy_coef = 0.0
  c.algo.pos_lm_coef = 0.0

  c.algo.overlong_filter = False
  c.algo.dynamic_sampling = False
  c.algo.max_gen_batches = 10
  c.algo.keep_pass_rate = placeholder(tuple)  # (lo, hi) pass-rate window; None = off

  c.algo.epochs = 1
  c.algo.minibatches = 1
  c.algo.micro_batches = 1  # gradient accumulation inside each minibatch (exact aggregation)
  # alias of rollout_is='token' with rollout_is_cap=tis_cap (setting both is an error); None = off
  c.algo.tis_cap = placeholder(float)

  # --- section 8 -------------------------------------------------------------------------------
  c.algo.sapo_tau_pos = 1.0  # SAPO gate temperature where A > 0 (policy_loss='sapo')
  c.algo.sapo_tau_neg = 1.05  # SAPO gate temperature where A <= 0
  c.algo.sapo_level = "token"  # token | sequence (gate on GSPO's sequence ratio)
  c.algo.clip_cov_ratio = 2e-4  # Clip-Cov: share of the minibatch's valid tokens zeroed
  c.algo.clip_cov_lb = 1.0  # Clip-Cov candidates: lb < token covariance < ub
  c.algo.clip_cov_ub = 5.0
  c.algo.kl_cov_ratio = 2e-3  # KL-Cov: share of valid tokens (top covariance) given |delta|
  c.algo.kl_cov_coef = 1.0  # KL-Cov: weight of |delta| on the selected tokens
  c.algo.passk_k = placeholder(int)  # pass@k's k; must be set with advantage='passk'
  c.algo.rollout_is = "none"  # rollout IS weights sampler -> old: none|token|sequence|geometric
  c.algo.rollout_is_cap = 2.0  # upper truncation of the IS weights
  c.algo.rollout_is_floor = placeholder(float)  # lower truncation; None = none
  c.algo.rollout_is_batch_norm = False  # divide the weights by their batch mean
  c.algo.rollout_rs = "none"  # rollout rejection: none | token | sequence | geometric
  c.algo.rollout_rs_lo = 0.0  # keep ratios in [lo, hi] (both needed when rollout_rs is on)
  c.algo.rollout_rs_hi = placeholder(float)
  c.algo.rollout_rs_veto = placeholder(float)  # reject a row with any token ratio below this
  c.algo.rollout_rs_k3 = placeholder(float)  # reject a row whose mean k3(rho) exceeds this
  c.algo.entropy_top_rho = 1.0  # 80/20: only the top-rho highest-entropy tokens train; 1 = off
  c.algo.entropy_mask_source = "old"  # entropy of the mask: old (scoring forward, H_old)
  c.algo.entropy_ctrl = False  # Skywork-OR1 adaptive entropy coefficient (from entropy_coef)
  c.algo.entropy_target = 0.2  # the bonus is on while the measured entropy is below this
  c.algo.entropy_coef_delta = 1e-4  # controller step per RL step
  c.algo.entropy_coef_min = 0.0
  c.algo.entropy_coef_max = 0.005
  c.algo.entropy_ctrl_estimate = "full"  # full (mean H of the update) | sampled (-mean old_logp)
  c.algo.opd_coef = 0.0  # on-policy distillation weight of -reverse KL to teacher; 0 = off
  c.algo.opd_discount = 0.0  # discount of the future reverse KL (Tinker); 0 = per token
  c.algo.opd_length_norm = False  # divide the discounted sum by its discounted count (MiniLLM)
  c.algo.opd_student_logp = "old"  # student log-prob in the reverse KL: old | sampler

  # --- teacher of on-policy distillation (algo.opd_coef > 0) -----------------------------------
  c.teacher = ml_collections.ConfigDict()
  # '' = none; 'hf:PATH'; 'run:DIR' (a run's exported DIR/hf); 'sft' (sft.out_dir); 'tiny'
  # (random, model.* sizes, seed + 1: for tests). Same tokenizer as the policy.
  c.teacher.source = ""
  c.teacher.dtype = ""  # compute dtype; '' = model.dtype

  # --- critic (section 6) ----------------------------------------------------------------------
  c.critic = ml_collections.ConfigDict()
  c.critic.enabled = False
  c.critic.lr = 1e-5
  c.critic.value_clip = 0.5
  c.critic.pretrain_steps = 0

  # --- optimizer -------------------------------------------------------------------------------
  c.optim = ml_collections.ConfigDict()
  c.optim.lr = 1e-6
  c.optim.warmup_steps = 0  # counted in optimizer updates: RL steps x epochs x minibatches
  c.optim.schedule = "constant"  # constant | cosine
  c.optim.weight_decay = 0.0
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.eps = 1e-8
  c.optim.max_grad_norm = 1.0

  # --- training loop ---------------------------------------------------------------------------
  c.train = ml_collections.ConfigDict()
  c.train.steps = 100
  c.train.eval_every = 0  # 0 = only before and after
  c.train.checkpoint_every = 0  # 0 = only at the end
  c.train.keep_checkpoints = 3
  c.train.run_dir = "runs/default"
  c.train.resume = False
  # keys allowed to differ from the run being resumed, e.g. ('optim.lr',); train.steps may grow
  c.train.resume_override = ()
  c.train.progress = True  # live progress bar
  c.train.export_hf = True  # export the final policy in Hugging Face format
  # stop after this many consecutive steps whose every update was skipped as non-finite (0 = never)
  c.train.max_skipped_steps = 10

  # --- supervised cold start (model.source='sft') -----------------------------------------------
  c.sft = ml_collections.ConfigDict()
  c.sft.steps = 600
  c.sft.batch_size = 64
  c.sft.lr = 3e-3
  c.sft.warmup_steps = 50
  c.sft.seed = 1234  # SFT examples come from their own stream of the train split
  c.sft.out_dir = "runs/sft"  # reused when it holds a checkpoint made with the same sft/model keys

  # --- device mesh -----------------------------------------------------------------------------
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # -1 = all devices not used by the other axes
  c.mesh.fsdp = 1
  c.mesh.tensor = 1

  # --- multi-process start-up (rljax.parallel.distributed) -------------------------------------
  c.dist = ml_collections.ConfigDict()
  # 'auto': jax.distributed.initialize() when the environment names a cluster (TPU pod, SLURM,
  # or the explicit keys below); 'off': single process.
  c.dist.mode = "auto"
  c.dist.coordinator_address = ""  # host:port of process 0
  c.dist.num_processes = placeholder(int)
  c.dist.process_id = placeholder(int)
  return c
