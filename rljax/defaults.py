"""Every config key, declared once: default, allowed values, one line of documentation.

``rljax.config()`` / ``get_config()`` builds the default ConfigDict from ``KEYS``;
``rljax.config_checks`` checks every value against its declaration at start-up; ``rljax keys``
prints them and ``docs/config.md`` is generated from them (``python -m rljax keys --markdown``).
A preset (``configs/<algo>.py``) changes only what makes that algorithm. Override anything on
the command line with ``--config.section.key=value``.
"""
import ml_collections
from ml_collections.config_dict import placeholder

from rljax.envs.base import ENV_NAME, TOOL_FORMATS
from rljax.keys import (ADAM_BETA, BOOL, FRACTION, KEY_TUPLE, NONEMPTY, NONNEG,
                        PASS_RATE_WINDOW, POSITIVE, SEED, SIZE, STRING, Check, Key, choice,
                        integer, optional, real, registered)
from rljax.models.config import supported_model_types

DTYPES = ("float32", "bfloat16", "float16")
ROLLOUT_LEVELS = ("none", "token", "sequence", "geometric")
MESH_AXIS = integer(1, also=(-1,))  # any one axis may be -1: the devices the others leave
MODEL_FAMILY = Check(lambda v: isinstance(v, str) and v in supported_model_types(),
                     "a registered model family (HF model_type)", str)
MODEL_DIM = integer(1, 2**20)  # a model dimension; larger ones overflow int32 shapes, never fit

KEYS = (
    Key("seed", 0, SEED, "the run's seed: model init, sampling, shuffling, Clip-Cov draws"),
    # --- model ---------------------------------------------------------------------------------
    Key("model.source", "tiny", NONEMPTY,
        "'tiny' (random, the sizes below) | 'hf:PATH' (a Hugging Face directory) | 'sft' (the "
        "supervised cold start of section sft, trained first if not on disk)"),
    Key("model.hidden_size", 128, MODEL_DIM, "width of the 'tiny'/'sft' model"),
    Key("model.intermediate_size", 384, MODEL_DIM, "MLP width of the 'tiny'/'sft' model"),
    Key("model.num_layers", 4, MODEL_DIM, "layers of the 'tiny'/'sft' model"),
    Key("model.num_heads", 4, MODEL_DIM, "query heads of the 'tiny'/'sft' model"),
    Key("model.num_kv_heads", 2, MODEL_DIM, "key/value heads of the 'tiny'/'sft' model (GQA)"),
    Key("model.rope_theta", 10000.0, POSITIVE, "RoPE base of the 'tiny'/'sft' model"),
    Key("model.tie_embeddings", True, BOOL, "'tiny'/'sft' model: LM head = embedding matrix"),
    Key("model.family", "llama", MODEL_FAMILY,
        "'tiny'/'sft' model: its family, an HF model_type (`rljax.models.families`)"),
    Key("model.num_experts", 4, MODEL_DIM,
        "'tiny'/'sft' model of an MoE family: experts of each (sparse) layer"),
    Key("model.experts_per_token", 2, MODEL_DIM,
        "'tiny'/'sft' model of an MoE family: experts each token is routed to (top-k)"),
    Key("model.moe_intermediate_size", 96, MODEL_DIM,
        "'tiny'/'sft' model of an MoE family: MLP width of one expert"),
    Key("model.moe_dispatch", "dense", choice("dense", "capacity"),
        "MoE layers: dense (exact, every expert sees every token) | capacity (GShard dispatch, "
        "tokens past an expert's capacity dropped and counted in moe/dropped)"),
    Key("model.moe_capacity_factor", 1.25, POSITIVE,
        "MoE capacity dispatch: slots per expert = factor x tokens x k / experts"),
    Key("model.router_replay", "off", choice("off", "R2", "R3"),
        "MoE routing in the trainer: off (its own) | R2 (the old-log-prob forward's experts, "
        "replayed in the update) | R3 (the sampler's experts, replayed in every policy forward)"),
    Key("model.dtype", "auto", choice("auto", *DTYPES),
        "compute dtype; auto = bfloat16 on GPUs/TPUs (params stay model.param_dtype), float32 "
        "on CPU"),
    Key("model.param_dtype", "float32", choice(*DTYPES), "parameter (master weight) dtype"),
    Key("model.remat", "none",
        choice("none", "full", "dots", True, False, "True", "False", "true", "false"),
        "per-layer rematerialisation: none | full (keep each layer's input) | dots (also the "
        "weight matmuls' outputs); True/False read as full/none"),
    Key("model.scan_layers", False, BOOL,
        "training/scoring forward as a lax.scan over the layers (same parameter tree); remat "
        "saves memory on XLA:CPU only with it"),
    Key("model.attention", "auto", choice("auto", "xla", "blockwise", "cudnn", "pallas"),
        "attention kernel: auto (cudnn on GPUs, float32 compute in bf16 inputs; pallas on TPUs; "
        "else blockwise) | xla (materialised scores, the reference) | blockwise | cudnn | "
        "pallas"),
    Key("model.attention_block", 128, SIZE, "max query/key block of the blockwise attention"),
    Key("model.matmul_precision", "default", choice("default", "high", "highest"),
        "float32 matmul precision: default (TF32 on GPUs, bf16 passes on TPUs) | high | highest "
        "(float32 parity with transformers on an accelerator)"),
    Key("model.logits_chunk", 512, SIZE,
        "sequence chunk of the log-prob/entropy head (never [B, T, V] at once)"),
    Key("model.forward_tokens", -1, integer(-1, 2**31 - 1),
        "most tokens per data shard in one forward/backward of scoring and the update (rows "
        "go in chunks, exact accumulation); -1 = auto (1024 per CPU thread of a device, no "
        "limit on accelerators), 0 = no limit"),
    Key("model.parallel_chunks", -1, integer(1, 1024, also=(-1,)),
        "row chunks (model.forward_tokens) computed side by side per scan iteration: "
        "independent, so XLA:CPU runs them on separate threads; -1 = auto (one per CPU thread "
        "of a device, 1 on accelerators)"),
    # --- data ----------------------------------------------------------------------------------
    Key("data.source", "embedded:arithmetic", NONEMPTY,
        "'embedded:arithmetic' | 'embedded:countdown' | 'jsonl:PATH' | 'hf:PATH' (local "
        "datasets files)"),
    Key("data.difficulty", 1, integer(0, 1000), "embedded tasks: problem difficulty"),
    Key("data.train_seed", 0, SEED, "embedded tasks: seed of the training problems"),
    Key("data.eval_seed", 1, SEED, "embedded tasks: seed of the held-out problems"),
    Key("data.num_eval", 256, SIZE, "held-out problems evaluated before/after training"),
    Key("data.tokenizer", "char", NONEMPTY, "'char' or a local Hugging Face tokenizer directory"),
    Key("data.chat_template", False, BOOL, "wrap prompts in the tokenizer's chat template"),
    Key("data.prompt_bucket", 32, SIZE,
        "prompts are left-padded to a multiple of this (fewer compilations)"),
    Key("data.max_prompt_tokens", 0, integer(0, 2**31 - 1),
        "longest prompt in tokens; 0 = the model's context less rollout.max_new_tokens"),
    Key("data.overlong_prompts", "error", choice("error", "drop"),
        "a longer prompt: 'error' (names it) | 'drop' (counted)"),
    Key("data.invalid_rows", "error", choice("error", "drop"),
        "a row with an empty prompt/answer, a NUL byte or a prompt given two answers: 'error' "
        "(names file:line) | 'drop' (counted)"),
    # --- rollout -------------------------------------------------------------------------------
    Key("rollout.prompts_per_step", 8, SIZE, "P: prompts per RL step"),
    Key("rollout.group_size", 8, SIZE, "G: completions per prompt"),
    Key("rollout.max_new_tokens", 64, SIZE, "T: completion budget in tokens"),
    Key("rollout.temperature", 1.0, POSITIVE, "sampling temperature"),
    Key("rollout.top_k", 0, integer(0, 2**31 - 1), "top-k sampling; 0 = off"),
    Key("rollout.top_p", 1.0, real(0, 1, lo_open=True), "nucleus sampling; 1 = off"),
    Key("rollout.min_p", 0.0, real(0, 1, hi_open=True), "min-p sampling; 0 = off"),
    Key("rollout.engine", "all_rows", registered("rollout_engine"),
        "what samples (rljax.rollout.engines, docs/rollout.md): all_rows (every row of a call "
        "decoded together) | continuous (slot budgets below, freed slots refilled) | any "
        "registered engine; read once, when the run is built"),
    Key("rollout.max_concurrent_rows", 0, integer(0, 2**31 - 1),
        "rollout.engine='continuous': slot budget S per data shard; 0 = all rows at once"),
    Key("rollout.kv_cache_bytes", 0, integer(0),
        "rollout.engine='continuous': KV-cache budget per data shard, caps S too; 0 = no cap"),
    Key("rollout.dtype", None, optional(choice(*DTYPES)),
        "sampler weights + KV cache dtype; None = model.dtype"),
    Key("rollout.max_staleness", 0, integer(0, 64),
        "asynchronous RL (docs/async.md): the sampler may start step s's batch with weights of "
        "learner step >= s - max_staleness, in a background thread; 0 = synchronous"),
    Key("rollout.inflight_chunk", 0, integer(0, 2**31 - 1),
        "in-flight weight updates (docs/async.md; needs rollout.max_staleness >= 1): decode in "
        "chunks of this many tokens, each with the newest weights the learner has published "
        "(the rows still decoding re-prefilled by them; extras['token_version'] per token); "
        "0 = off"),
    # --- reward (ALGORITHMS.md section 1) ------------------------------------------------------
    Key("reward.fn", "exact_match", registered("reward_fn"), "the verifier"),
    Key("reward.format_weight", 0.0, real(), "weight of the format term added to correctness"),
    Key("reward.wrong_value", 0.0, real(), "reward of a wrong answer (0 or -1)"),
    Key("reward.overlong_buffer", 0, integer(0, 2**31 - 1),
        "DAPO soft overlong punishment: buffer in tokens before max_new_tokens; 0 = off"),
    Key("reward.overlong_penalty", 1.0, NONNEG, "DAPO soft overlong punishment: maximum penalty"),
    Key("reward.timeout_s", 5.0, POSITIVE,
        "per verifier call: a hard bound (the worker process is killed)"),
    Key("reward.workers", 4, integer(1, 1024), "verifier worker processes"),
    Key("reward.max_logged_failures", 100, integer(0),
        "failed calls sampled into run_dir/reward_failures.jsonl"),
    Key("reward.max_worker_memory_mb", 2048, integer(0),
        "address space a verifier worker may add to what it inherited (MB; RLIMIT_AS); 0 = no "
        "limit"),
    Key("reward.worker_max_calls", 0, integer(0),
        "replace a verifier worker after this many calls (a leak's bound); 0 = never"),
    # --- multi-turn environment (docs/multiturn.md) -------------------------------------------
    Key("env.name", None, ENV_NAME,
        "None = single-turn rollouts scored by reward.fn | a registered environment: multi-turn "
        "rollouts (turns of at most rollout.max_new_tokens, tool calls, observations) scored by "
        "it"),
    Key("env.max_turns", 4, integer(1, 10**4),
        "most policy turns per episode; an episode still running after them ends unsolved"),
    Key("env.max_tokens", 256, SIZE,
        "token budget of a trajectory after its prompt (policy and environment tokens): the "
        "record's T; a trajectory that reaches it ends, flagged truncated"),
    Key("env.timeout_s", 5.0, POSITIVE,
        "per reset / step call in its worker process (reward.workers of them): a hard bound, the "
        "trajectory of a call past it (or crashing) ends with reward 0, counted"),
    Key("env.tool_format", "compact", choice(*TOOL_FORMATS),
        "how tool calls are written: compact '<calc 12*3>' (char-level tasks) | hermes "
        "'<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>' (Qwen / Hermes)"),
    Key("env.engine", "turn_sync", choice("turn_sync", "continuous"),
        "turn_sync: every turn is one sampler call over the live rows, then every step (a turn "
        "waits for its slowest row and tool) | continuous: a row whose turn ends steps its "
        "environment while the others decode, and re-enters with its KV cache kept "
        "(rljax/envs/continuous.py)"),
    Key("env.turn_discount", 1.0, FRACTION,
        "token-level estimators (gae, reinforce_pp, remax): < 1 puts each turn's reward at its "
        "last policy token, discounted per turn (a token of turn k sees sum_j>=k d^(j-k) r_j); "
        "1 = the episode's summed reward on its last token"),
    Key("env.slots", 0, integer(0, 2**31 - 1),
        "continuous engine: rows decoding at once (lanes); 0 = every row of the batch (a call "
        "narrows to S/8, S/4 or S/2 lanes when that holds the rows decoding or ready to)"),
    # --- algorithm (sections 2-5, 7) -----------------------------------------------------------
    Key("algo.advantage", "grpo", registered("advantage"), "advantage estimator"),
    Key("algo.adv_std", "group", choice("group", "batch", "none"),
        "grpo/passk_n: divide by the std of the group | batch | none"),
    Key("algo.adv_whiten", False, BOOL, "whiten advantages over the batch"),
    Key("algo.gamma", 1.0, FRACTION, "discount"),
    Key("algo.lam", 0.95, FRACTION, "GAE lambda (the policy's)"),
    Key("algo.lam_critic", None, optional(FRACTION), "GAE lambda of critic targets; None = lam"),
    Key("algo.lam_alpha", None, optional(real(0, lo_open=True)),
        "VAPO length-adaptive lambda = 1 - 1/(alpha l); None = off (VAPO 0.05)"),
    Key("algo.policy_loss", "ppo", registered("policy_loss"), "policy objective"),
    Key("algo.clip_eps_low", 0.2, real(0, 1), "PPO clip: ratio >= 1 - eps_low"),
    Key("algo.clip_eps_high", 0.2, NONNEG, "PPO clip: ratio <= 1 + eps_high (DAPO 0.28)"),
    Key("algo.dual_clip_c", None, optional(real(1, lo_open=True)),
        "dual-clip PPO: for A < 0 the loss is at most -A c; None = off"),
    Key("algo.cispo_eps_high", 4.0, NONNEG, "CISPO: IS weight <= 1 + eps_high"),
    Key("algo.cispo_eps_low", None, optional(NONNEG),
        "CISPO: IS weight >= 1 - eps_low; None = no lower bound"),
    Key("algo.gmpo_eps", 0.4, real(0, lo_open=True), "GMPO: log-ratio clip"),
    Key("algo.loss_agg", "seq_mean_token_mean", registered("loss_agg"), "loss aggregation"),
    Key("algo.loss_norm_constant", None, optional(real(0, lo_open=True)),
        "seq_mean_token_sum_norm's constant; None = rollout.max_new_tokens"),
    Key("algo.kl_estimator", "k3", registered("kl_estimator"), "KL estimator"),
    Key("algo.kl_placement", "loss", choice("loss", "reward", "none"),
        "KL to the reference: in the loss | in the reward | none (no reference model)"),
    Key("algo.kl_coef", 0.04, NONNEG, "KL weight beta (initial, with kl_target)"),
    Key("algo.kl_target", None, optional(real(0, lo_open=True)),
        "adaptive KL (Ziegler et al.): target KL; None = fixed coefficient"),
    Key("algo.kl_horizon", 10000, integer(1), "adaptive KL: horizon in rows"),
    Key("algo.ref_update", "frozen", choice("frozen", "ema"),
        "reference model: frozen | ema of the policy (T1)"),
    Key("algo.ref_ema_decay", 0.99, FRACTION, "EMA reference: decay d"),
    Key("algo.kl_normalize", False, BOOL,
        "T1's normalised KL: the KL term's aggregation is token_mean"),
    Key("algo.router_aux_coef", None, optional(NONNEG),
        "MoE load-balancing loss weight (Switch Transformer); None = the checkpoint's "
        "router_aux_loss_coef (0 without MoE layers)"),
    Key("algo.entropy_coef", 0.0, real(), "entropy bonus weight (8.7: the controller's c_0)"),
    Key("algo.pos_lm_coef", 0.0, NONNEG, "VAPO: LM loss weight on positive examples"),
    Key("algo.overlong_filter", False, BOOL, "truncated completions get no loss (DAPO ablation)"),
    Key("algo.dynamic_sampling", False, BOOL,
        "DAPO: resample until P groups with a reward spread are kept"),
    Key("algo.max_gen_batches", 10, integer(1, 10**6), "dynamic sampling: most rounds per step"),
    Key("algo.keep_pass_rate", None, PASS_RATE_WINDOW,
        "dynamic sampling: keep groups whose pass rate is in [lo, hi]; None = a reward spread"),
    Key("algo.epochs", 1, integer(1, 10**6), "passes over each rollout batch"),
    Key("algo.minibatches", 1, integer(1, 10**6), "optimizer steps per epoch"),
    Key("algo.micro_batches", 1, integer(1, 10**6),
        "gradient accumulation inside each minibatch (exact aggregation)"),
    Key("algo.tis_cap", None, optional(real(0, lo_open=True)),
        "alias of rollout_is='token' with rollout_is_cap=tis_cap (not both); None = off"),
    # --- section 8 -----------------------------------------------------------------------------
    Key("algo.sapo_tau_pos", 1.0, POSITIVE, "SAPO gate temperature where A > 0"),
    Key("algo.sapo_tau_neg", 1.05, POSITIVE, "SAPO gate temperature where A <= 0"),
    Key("algo.sapo_level", "token", choice("token", "sequence"),
        "SAPO: gate on the token ratio | on GSPO's sequence ratio"),
    Key("algo.clip_cov_ratio", 2e-4, real(0, 1, lo_open=True),
        "Clip-Cov: share of the minibatch's valid tokens zeroed"),
    Key("algo.clip_cov_lb", 1.0, real(), "Clip-Cov candidates: lb < token covariance"),
    Key("algo.clip_cov_ub", 5.0, real(), "Clip-Cov candidates: token covariance < ub"),
    Key("algo.kl_cov_ratio", 2e-3, real(0, 1, lo_open=True),
        "KL-Cov: share of valid tokens (top covariance) given |delta|"),
    Key("algo.kl_cov_coef", 1.0, NONNEG, "KL-Cov: weight of |delta| on the selected tokens"),
    Key("algo.passk_k", None, optional(integer(1, 2**31 - 1)),
        "pass@k training's k; must be set with advantage='passk'"),
    Key("algo.rollout_is", "none", choice(*ROLLOUT_LEVELS),
        "rollout IS weights sampler -> old: none | token | sequence | geometric"),
    Key("algo.rollout_is_cap", 2.0, POSITIVE, "rollout IS: upper truncation"),
    Key("algo.rollout_is_floor", None, optional(NONNEG), "rollout IS: lower truncation; None = none"),
    Key("algo.rollout_is_batch_norm", False, BOOL, "rollout IS: divide by the batch mean"),
    Key("algo.rollout_rs", "none", choice(*ROLLOUT_LEVELS),
        "rollout rejection: none | token | sequence | geometric"),
    Key("algo.rollout_rs_lo", 0.0, optional(NONNEG), "rollout rejection: keep ratios >= lo"),
    Key("algo.rollout_rs_hi", None, optional(NONNEG), "rollout rejection: keep ratios <= hi"),
    Key("algo.rollout_rs_veto", None, optional(real(0, lo_open=True)),
        "reject a row with any token ratio below this; None = off"),
    Key("algo.rollout_rs_k3", None, optional(NONNEG),
        "reject a row whose mean k3(rho) exceeds this; None = off"),
    Key("algo.entropy_top_rho", 1.0, NONNEG,
        "80/20: only the top-rho highest-entropy tokens train; 1 = off"),
    Key("algo.entropy_mask_source", "old", choice("old", "current"),
        "80/20 mask entropy: old (H_old of the scoring forward; 'current' is not implemented)"),
    Key("algo.entropy_ctrl", False, BOOL,
        "Skywork-OR1 adaptive entropy coefficient (starts at entropy_coef)"),
    Key("algo.entropy_target", 0.2, real(), "entropy controller: bonus on below this entropy"),
    Key("algo.entropy_coef_delta", 1e-4, NONNEG, "entropy controller: step per RL step"),
    Key("algo.entropy_coef_min", 0.0, real(), "entropy controller: lower clip"),
    Key("algo.entropy_coef_max", 0.005, real(), "entropy controller: upper clip"),
    Key("algo.entropy_ctrl_estimate", "full", choice("full", "sampled"),
        "entropy controller's measure: full (mean H of the update) | sampled (-mean old_logp)"),
    Key("algo.opd_coef", 0.0, NONNEG,
        "on-policy distillation: weight of -reverse KL to the teacher; 0 = off"),
    Key("algo.opd_discount", 0.0, FRACTION,
        "on-policy distillation: discount of the future reverse KL; 0 = per token"),
    Key("algo.opd_length_norm", False, BOOL,
        "on-policy distillation: divide the discounted sum by its discounted count (MiniLLM)"),
    Key("algo.opd_student_logp", "old", choice("old", "sampler"),
        "on-policy distillation: student log-prob in the reverse KL"),
    # --- teacher of on-policy distillation (algo.opd_coef > 0) ---------------------------------
    Key("teacher.source", "", STRING,
        "'' = none | 'hf:PATH' | 'run:DIR' (DIR/hf) | 'sft' (sft.out_dir) | 'tiny' (random, "
        "seed + 1: for tests); same tokenizer as the policy"),
    Key("teacher.dtype", "", choice("", *DTYPES), "teacher compute dtype; '' = model.dtype"),
    # --- critic (section 6) --------------------------------------------------------------------
    Key("critic.enabled", False, BOOL, "train a value model (PPO, VC-PPO, VAPO, ORZ)"),
    Key("critic.lr", 1e-5, POSITIVE, "critic learning rate"),
    Key("critic.value_clip", 0.5, NONNEG, "value clip around the old values"),
    Key("critic.pretrain_steps", 0, integer(0, 10**6),
        "value pretraining steps on Monte-Carlo returns before RL (VC-PPO)"),
    # --- optimizer -----------------------------------------------------------------------------
    Key("optim.lr", 1e-6, POSITIVE, "policy learning rate"),
    Key("optim.warmup_steps", 0, integer(0),
        "linear warmup in optimizer updates (RL steps x epochs x minibatches)"),
    Key("optim.schedule", "constant", choice("constant", "cosine"), "after warmup"),
    Key("optim.weight_decay", 0.0, NONNEG, "AdamW weight decay"),
    Key("optim.b1", 0.9, ADAM_BETA, "AdamW beta1"),
    Key("optim.b2", 0.999, ADAM_BETA, "AdamW beta2"),
    Key("optim.eps", 1e-8, POSITIVE, "AdamW epsilon"),
    Key("optim.max_grad_norm", 1.0, NONNEG, "global-norm gradient clip; 0 = off"),
    # --- training loop -------------------------------------------------------------------------
    Key("train.steps", 100, integer(1, 10**9), "RL steps"),
    Key("train.eval_every", 0, integer(0), "held-out eval every N steps; 0 = before and after"),
    Key("train.checkpoint_every", 0, integer(0), "checkpoint every N steps; 0 = at the end"),
    Key("train.keep_checkpoints", 3, integer(1), "checkpoints kept"),
    Key("train.run_dir", "runs/default", NONEMPTY, "where metrics, checkpoints and exports go"),
    Key("train.resume", False, BOOL, "continue the run in run_dir"),
    Key("train.resume_override", (), KEY_TUPLE,
        "keys allowed to differ from the run being resumed, e.g. ('optim.lr',); steps may grow"),
    Key("train.progress", True, BOOL, "live progress bar"),
    Key("train.export_hf", True, BOOL, "export the final policy in Hugging Face format"),
    Key("train.compilation_cache", True, BOOL,
        "keep compiled XLA programs in run_dir/xla_cache (in JAX_COMPILATION_CACHE_DIR instead "
        "where that is set), so a restarted or resumed run loads them instead of compiling again"),
    Key("train.max_skipped_steps", 10, integer(0),
        "stop after this many consecutive steps whose every update was skipped as non-finite; "
        "0 = never"),
    Key("train.preempt_grace_s", 30.0, POSITIVE,
        "after SIGTERM: seconds for the step in flight and the checkpoint save before exiting"),
    # --- supervised cold start (model.source='sft') --------------------------------------------
    Key("sft.steps", 600, integer(1, 10**9), "SFT steps"),
    Key("sft.batch_size", 64, SIZE, "SFT batch"),
    Key("sft.lr", 3e-3, POSITIVE, "SFT learning rate"),
    Key("sft.warmup_steps", 50, integer(0), "SFT warmup steps"),
    Key("sft.seed", 1234, SEED, "SFT examples come from their own stream of the train split"),
    Key("sft.out_dir", "runs/sft", NONEMPTY,
        "reused when it holds a checkpoint made with the same sft/model keys"),
    # --- device mesh ---------------------------------------------------------------------------
    Key("mesh.data", -1, MESH_AXIS, "data-parallel axis; -1 = the devices the others leave"),
    Key("mesh.fsdp", 1, MESH_AXIS, "fully sharded data-parallel axis"),
    Key("mesh.expert", 1, MESH_AXIS,
        "expert-parallel axis: MoE expert weights split by expert; batch rows split over it too, "
        "other weights replicated"),
    Key("mesh.tensor", 1, MESH_AXIS, "tensor-parallel axis"),
    Key("mesh.cpu_devices", -1, integer(0, 4096, also=(-1,)),
        "CPU devices `rljax train` splits the machine into before JAX starts (XLA:CPU runs one "
        "device on about one core; the mesh's data axis takes them); -1 = auto: one per core, "
        "as many as a step's rows split over; 0 = JAX's default (one)"),
    Key("mesh.sampler_devices", 0, integer(0),
        "devices of the sampler's own (data-parallel) mesh, the last ones; the weights are "
        "copied to it after every update (docs/async.md); 0 = colocated on the learner's mesh"),
    Key("mesh.learner_devices", 0, integer(0),
        "with mesh.sampler_devices: devices of the learner's mesh (the first ones; the axes "
        "above lay them out); 0 = all the sampler leaves"),
    # --- multi-process start-up (rljax.parallel.distributed) -----------------------------------
    Key("dist.mode", "auto", choice("auto", "off"),
        "auto: jax.distributed.initialize() when the environment names a cluster; off"),
    Key("dist.coordinator_address", "", STRING, "host:port of process 0"),
    Key("dist.num_processes", None, optional(integer(1)), "processes; None = from the cluster"),
    Key("dist.process_id", None, optional(integer(0)), "this process; None = from the cluster"),
)

KEY_BY_NAME = {key.name: key for key in KEYS}


def options(name: str) -> tuple:
  """The values a choice key allows (components check direct calls against the declaration)."""
  return KEY_BY_NAME[name].check.options


def get_config() -> ml_collections.ConfigDict:
  """The default configuration: every key of ``KEYS`` with its default."""
  config = ml_collections.ConfigDict()
  for key in KEYS:
    *sections, leaf = key.name.split(".")
    node = config
    for section in sections:
      if section not in node:
        node[section] = ml_collections.ConfigDict()
      node = node[section]
    node[leaf] = placeholder(key.check.type) if key.default is None else key.default
  return config
