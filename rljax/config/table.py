"""Every config key, declared once: default, allowed values, when it is read, one line of doc.

``rljax.config()`` / ``get_config()`` builds the default ConfigDict from ``KEYS``;
``rljax.config.checks`` checks every value against its declaration at start-up, refuses a key set
away from its default that nothing reads, and checks ``RELATIONS``; ``rljax keys`` prints them and
``docs/config.md`` is generated from them (``python -m rljax keys --markdown``). A preset
(``configs/algos/<algo>.py``) changes only what makes that algorithm. Override anything on the
command line with ``--config.section.key=value``.

The format (``rljax.config.declare``), one line per fact::

  Key("section.name", default, check, "one line of doc"[, read_if=WHEN])

- ``check``: what the value may be: ``BOOL``, ``SIZE``, ``integer(lo, hi)``, ``real(lo, hi)``,
  ``choice(...)``, ``registered("advantage")`` (a registered component), ``optional(...)``.
  Components take a choice key's values from here (``options("model.router_replay")``).
- ``read_if``: when the run reads the key (default ``ALWAYS``). A key whose condition is false
  must keep its default, or the run stops naming it and the reason (``When.unless``). Conditions:
  ``equals(key, v)``, ``differs(key, v)``, ``above(key, v)``, ``meta_says(key, test, says)`` (the
  component a key names declares something), ``component_reads()`` (an ``algo.*``
  hyperparameter, read when a resolved component binds it: its registration names the key), the
  named ones (``CRITIC``, ``MULTI_TURN``, ...), combined with ``&`` and ``|``.
  The named conditions are in ``rljax.config.conditions``.
- Constraints between keys are ``Relation``s in ``RELATIONS`` (``rljax.config.relations``).

The config package sits at the bottom of rljax (it imports nothing else of it): models and
components read their choices from this table, and it registers nothing by being read.
"""
from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from rljax.config.declare import (ADAM_BETA, BOOL, Check, FRACTION, KEY_TUPLE, Key, NONEMPTY,
                                  NONNEG, PASS_RATE_WINDOW, POSITIVE, SEED, SIZE, STRING, When,
                                  above, choice, declare, differs, equals, integer, meta_says,
                                  optional, parsed, real, registered, registered_spec,
                                  registered_tuple)
from rljax.config.conditions import (COMPONENT, CRITIC, DATA_SOURCE_READS, DRIVER_READS,
                                     DYNAMIC_SAMPLING, EMBEDDED_SOURCE, ENGINE_READS,
                                     FRESH_MODEL, JUDGE_NUMBER, KL_TERM, LOGGER_READS, LORA,
                                     MOE_MODEL, MULTI_TURN, OVERLONG_SHAPING, REWARD_SOURCE_READS,
                                     SELECTIVE, SFT_STOP, SINGLE_TURN, VERIFIER_PROCESSES,
                                     _agg_modes, _one_reward_per_episode, _token_level)
from rljax.config.reward_spec import (judge_pattern, judge_template, reward_clip,
                                      reward_normalize, reward_weights)

DTYPES = ("float32", "bfloat16", "float16")
ROLLOUT_LEVELS = ("none", "token", "sequence", "geometric")
OLD_LOGP_SOURCES = ("recompute", "sampler")  # algo.old_logp
REMAT_MODES = ("none", "full", "dots")  # model.remat; True/False of old configs: full/none
MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")  # the mesh's axes, in device order
MESH_AXIS = integer(1, also=(-1,))  # any one axis may be -1: the devices the others leave
MODEL_DIM = integer(1, 2**20)  # a model dimension; larger ones overflow int32 shapes, never fit
STRING_TUPLE = Check(lambda v: isinstance(v, (tuple, list)) and all(isinstance(t, str) for t in v),
                     "a tuple of strings", tuple)
# The names themselves are checked by rljax.models.lora.resolve_targets (one line naming them).
LORA_TARGETS = Check(lambda v: isinstance(v, (tuple, list)) and len(v) > 0
                     and all(isinstance(t, str) for t in v),
                     "a non-empty tuple of projection names, or ('all',)", tuple)

# Why a model whose MoE layers dispatch by capacity is never packed (rljax.learner.packing;
# rljax.config.relations refuses model.pack=True with it).
CAPACITY_UNPACKED = (
    "model.pack=True with model.moe_dispatch='capacity': under capacity dispatch a token's "
    "output depends on the other tokens of its forward (their number sets each expert's "
    "capacity, their order its queue), so packed rows drop other token-choice pairs than padded "
    "ones and compute another function; use model.pack='auto' or False (padded rows), or a "
    "dropless dispatch ('sparse', 'dense'), which packs exactly")


# ``model.pack='auto'`` (``rljax.learner.packing.packs``): a forward packs when its packed layout
# has at least this many chunks, on these platforms. Packing saves work only by the chunks the
# batch leaves empty; in one chunk it adds the layout's gathers and saves nothing: at rows of 256
# tokens the update in one chunk ran 0.85x packed and scoring in two 2.1x (same rows, same
# process); from two chunks the step's saving repays the packed program's longer compilation
# within tens of steps (docs/results/benchmarks/packing.md, "When packing pays"). Measured on CPUs
# only: on GPUs cuDNN attention holds one sequence a row (packed rows fall back to the blockwise
# kernel), and with no token limit (auto there) a forward is one chunk anyway.
AUTO_PACK_MIN_CHUNKS = 2
AUTO_PACK_PLATFORMS = ("cpu",)

KEYS = declare((
    Key("seed", 0, SEED, "the run's seed: model init (not the SFT cold start's: sft.seed), "
        "sampling, shuffling, Clip-Cov draws"),
    # --- model ---------------------------------------------------------------------------------
    Key("model.source", "tiny", NONEMPTY,
        "'tiny' (random, the sizes below) | 'hf:PATH' (a Hugging Face directory) | 'sft' (the "
        "supervised cold start of section sft, trained first if not on disk) | 'run:DIR[@STEP]' "
        "(the policy of another run's latest checkpoint, or of step STEP)"),
    Key("model.hidden_size", 128, MODEL_DIM, "width of the 'tiny'/'sft' model",
        read_if=FRESH_MODEL),
    Key("model.intermediate_size", 384, MODEL_DIM, "MLP width of the 'tiny'/'sft' model",
        read_if=FRESH_MODEL),
    Key("model.num_layers", 4, MODEL_DIM, "layers of the 'tiny'/'sft' model", read_if=FRESH_MODEL),
    Key("model.num_heads", 4, MODEL_DIM, "query heads of the 'tiny'/'sft' model",
        read_if=FRESH_MODEL),
    Key("model.num_kv_heads", 2, MODEL_DIM, "key/value heads of the 'tiny'/'sft' model (GQA)",
        read_if=FRESH_MODEL),
    Key("model.rope_theta", 10000.0, POSITIVE, "RoPE base of the 'tiny'/'sft' model",
        read_if=FRESH_MODEL),
    Key("model.tie_embeddings", True, BOOL, "'tiny'/'sft' model: LM head = embedding matrix",
        read_if=FRESH_MODEL),
    Key("model.family", "llama", registered("model_family"),
        "'tiny'/'sft' model: its family, an HF model_type (`rljax.models.families`)",
        read_if=FRESH_MODEL),
    Key("model.num_experts", 4, MODEL_DIM,
        "'tiny'/'sft' model of an MoE family: experts of each (sparse) layer",
        read_if=FRESH_MODEL & MOE_MODEL),
    Key("model.experts_per_token", 2, MODEL_DIM,
        "'tiny'/'sft' model of an MoE family: experts each token is routed to (top-k)",
        read_if=FRESH_MODEL & MOE_MODEL),
    Key("model.moe_intermediate_size", 96, MODEL_DIM,
        "'tiny'/'sft' model of an MoE family: MLP width of one expert",
        read_if=FRESH_MODEL & MOE_MODEL),
    Key("model.moe_dispatch", "sparse", choice("dense", "sparse", "capacity"),
        "MoE layers in the trainer: sparse (dropless: tokens sorted by expert, grouped matmuls) "
        "| dense (the reference: every expert sees every token) | capacity (GShard dispatch, "
        "tokens past an expert's capacity dropped and counted in moe/dropped)", read_if=MOE_MODEL),
    Key("model.moe_capacity_factor", 1.25, POSITIVE,
        "MoE capacity dispatch: slots per expert = factor x tokens x k / experts",
        read_if=MOE_MODEL & equals("model.moe_dispatch", "capacity")),
    Key("model.router_replay", "off", choice("off", "R2", "R3"),
        "MoE routing in the trainer: off (its own) | R2 (the old-log-prob forward's experts, "
        "replayed in the update) | R3 (the sampler's experts, replayed in every policy forward)",
        read_if=MOE_MODEL),
    Key("model.dtype", "auto", choice("auto", *DTYPES),
        "compute dtype; auto = bfloat16 on GPUs/TPUs (params stay model.param_dtype), float32 "
        "on CPU"),
    Key("model.param_dtype", "float32", choice(*DTYPES), "parameter (master weight) dtype"),
    Key("model.remat", "none",
        choice(*REMAT_MODES, True, False, "True", "False", "true", "false"),
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
    Key("model.pack", "auto", choice("auto", "True", "False", "true", "false"),
        "scoring and update forwards take the sequences packed (first-fit decreasing) into "
        "rows as wide as the padded ones, model.forward_tokens per data shard a chunk; outputs "
        "go back to the padded layout, so every loss is the padded one's; auto = packed on "
        f"{'/'.join(AUTO_PACK_PLATFORMS)} where a forward's packed layout has at least "
        f"{AUTO_PACK_MIN_CHUNKS} chunks (the empty ones are skipped), else padded; True / False "
        "force it. A model whose MoE layers dispatch by capacity is never packed (True is "
        "refused: that dispatch depends on the tokens sharing a forward)"),
    Key("model.parallel_chunks", -1, integer(1, 1024, also=(-1,)),
        "row chunks (model.forward_tokens) computed side by side per scan iteration: "
        "independent, so XLA:CPU runs them on separate threads; -1 = auto (one per CPU thread "
        "of a device, 1 on accelerators)"),
    Key("model.lora.rank", 0, integer(0, 2**16),
        "rank r of low-rank adapters (LoRA) on the projections model.lora.targets; the rest of "
        "the model is the frozen base, which is also the KL reference; 0 = full fine-tuning"),
    Key("model.lora.alpha", 32.0, POSITIVE,
        "LoRA scale alpha: the update is (alpha / r) x A B (fixed alpha with 1/r keeps the best "
        "learning rate about rank-independent)", read_if=LORA),
    Key("model.lora.targets", ("all",), LORA_TARGETS,
        "projections that get adapters, PEFT target_modules names: q_proj k_proj v_proj o_proj "
        "gate_proj up_proj down_proj (an MLP name covers the MoE experts too) or 'all'",
        read_if=LORA),
    Key("model.lora.base_dtype", "param", choice("param", "compute"),
        "the frozen base's dtype: param (model.param_dtype) | compute (model.dtype: bfloat16 on "
        "accelerators halves the base's memory; adapters and their optimizer state stay in "
        "model.param_dtype)", read_if=LORA),
    Key("model.lora.init_from", None, optional(NONEMPTY),
        "a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) the "
        "adapters start from instead of PEFT's init (B = 0); its rank, alpha and target modules "
        "must be model.lora.rank, alpha and targets, its shapes the base's (docs/integrations.md)",
        read_if=LORA),
    # --- data ----------------------------------------------------------------------------------
    Key("data.source", "embedded:arithmetic",
        registered_spec("data_source", "jsonl:data/train.jsonl"),
        "where prompts come from: a registered data source and its argument (docs/algorithms.md, "
        "'Data sources'): embedded:TASK | reasoning_gym:NAME[,NAME...] (extra [reasoning_gym]) | "
        "verifiers:ID (with env.name='verifiers'; extra [verifiers]) | jsonl:PATH | hf:PATH "
        "(local datasets files) | code:PATH (unit-tested programming problems) | any registered "
        "source"),
    Key("data.difficulty", 1, integer(0, 1000), "embedded tasks: problem difficulty",
        read_if=EMBEDDED_SOURCE),
    Key("data.train_seed", 0, SEED, "generated tasks: seed of the training problems"),
    Key("data.eval_seed", 1, SEED, "generated tasks: seed of the held-out problems"),
    Key("data.reasoning_gym.weights", "", STRING,
        "reasoning_gym source: 'NAME=W,NAME=W' sampling weight of each task; '' = equal",
        read_if=DATA_SOURCE_READS),
    Key("data.reasoning_gym.config", "{}", STRING,
        "reasoning_gym source: JSON {task: {setting: value}} passed to the task's generator "
        "(reasoning_gym.create_dataset); seed 0 and the library's size unless given",
        read_if=DATA_SOURCE_READS),
    Key("data.reasoning_gym.template", "{question}", NONEMPTY,
        "reasoning_gym source: the prompt, a str.format template over the item's question and "
        "metadata fields, e.g. '{expression}='", read_if=DATA_SOURCE_READS),
    Key("data.verifiers.args", "{}", STRING,
        "verifiers source: JSON object of keyword arguments for the environment's loader "
        "(load_environment or MODULE:FUNCTION)", read_if=DATA_SOURCE_READS),
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
        "rollout.engine='continuous': slot budget S per data shard; 0 = all rows at once",
        read_if=ENGINE_READS),
    Key("rollout.kv_cache_bytes", 0, integer(0),
        "rollout.engine='continuous': KV-cache budget per data shard, caps S too; 0 = no cap",
        read_if=ENGINE_READS),
    Key("rollout.dtype", None, optional(choice(*DTYPES)),
        "sampler weights + KV cache dtype; None = model.dtype"),
    Key("rollout.weight_dtype", None, optional(choice("float8_e4m3fn")),
        "low-precision sampling (docs/rollout.md): each time the learner's weights are "
        "published to the engine, the layers' projection and expert kernels are quantised per "
        "output channel to this dtype and the sampler computes with the dequantised values in "
        "its dtype (rollout.dtype): the numerics of FP8 weights, the learner keeping full "
        "precision; FP8 matmuls and their memory saving need an accelerator path not built "
        "here; None = off"),
    Key("rollout.draft", "none", choice("none", "ngram", "layers"),
        "speculative decoding (docs/rollout.md): 'ngram' drafts by prompt lookup in the row's "
        "own context, 'layers' by the policy's first rollout.draft_layers layers; k drafted "
        "tokens are verified in one forward with exact rejection sampling, so the rollout's "
        "distribution (greedy: its tokens) and log-probs are plain sampling's; 'none' = off",
        read_if=ENGINE_READS),
    Key("rollout.draft_tokens", 4, integer(1, 64),
        "speculative decoding: k, tokens drafted per verification forward",
        read_if=ENGINE_READS & differs("rollout.draft", "none", "speculative decoding is off "
                                       "(rollout.draft='none')")),
    Key("rollout.draft_ngram", 3, integer(1, 64),
        "rollout.draft='ngram': n, the length of the row's suffix looked up in its context",
        read_if=ENGINE_READS & equals("rollout.draft", "ngram")),
    Key("rollout.draft_layers", 1, integer(1, 2**20),
        "rollout.draft='layers': the draft's layers, the policy's first ones (fewer than "
        "model.num_layers)", read_if=ENGINE_READS & equals("rollout.draft", "layers")),
    Key("rollout.max_staleness", 0, integer(0, 64),
        "asynchronous RL (docs/async.md): the sampler may start step s's batch with weights of "
        "learner step >= s - max_staleness, in a background thread; 0 = synchronous"),
    Key("rollout.inflight_chunk", 0, integer(0, 2**31 - 1),
        "in-flight weight updates (docs/async.md; needs rollout.max_staleness >= 1): decode in "
        "chunks of this many tokens, each with the newest weights the learner has published "
        "(the rows still decoding re-prefilled by them; extras['token_version'] per token); "
        "0 = off",
        read_if=above("rollout.max_staleness", 0, (
        "the synchronous loop (rollout.max_staleness=0) gets new weights only between steps; "
        "set rollout.max_staleness >= 1")) & When(
            lambda f, k: f[k] < f["rollout.max_new_tokens"], "fewer than rollout.max_new_tokens",
            lambda f, k: f"a rollout of rollout.max_new_tokens={f['rollout.max_new_tokens']} is "
                         "one chunk")),
    # --- reward (docs/algorithms.md section 1) -------------------------------------------------
    Key("reward.fn", "exact_match", registered("reward_fn"), "the verifier", read_if=SINGLE_TURN),
    Key("reward.format_weight", 0.0, real(), "weight of the format term added to correctness",
        read_if=SINGLE_TURN),
    Key("reward.wrong_value", 0.0, real(), "reward of a wrong answer (0 or -1)",
        read_if=SINGLE_TURN),
    Key("reward.overlong_buffer", 0, integer(0, 2**31 - 1),
        "DAPO soft overlong punishment: buffer in tokens before max_new_tokens; 0 = off",
        read_if=SINGLE_TURN),
    Key("reward.overlong_penalty", 1.0, NONNEG, "DAPO soft overlong punishment: maximum penalty",
        read_if=OVERLONG_SHAPING),
    Key("reward.timeout_s", 5.0, POSITIVE,
        "per verifier call: a hard bound (the worker process is killed)",
        read_if=SINGLE_TURN & VERIFIER_PROCESSES),
    Key("reward.sources", "", parsed(reward_weights, "'name:weight,...' of registered reward "
                                     "sources (`rljax components`), finite weights, not all 0"),
        "the run's reward: a weighted sum of named sources, e.g. 'verifier:1.0,judge:0.5' "
        "(docs/reward_models.md); each logged raw as reward/<name>, a weight-0 source logged "
        "only; '' = the task's own source alone: 'verifier' (reward.fn), or 'env' with env.name. "
        "That source always runs (its correct flags are the accuracy)"),
    Key("reward.normalize", "", parsed(reward_normalize, "'name:whiten,...'"),
        "per-source normalisation before weighting: 'judge:whiten' = (x - mean) / sqrt(var + "
        "1e-8) over the rows scored together (population variance); '' = none"),
    Key("reward.clip", "", parsed(reward_clip, "'name:lo:hi,...' with lo < hi"),
        "per-source clipping to [lo, hi] before weighting (after reward.normalize), e.g. "
        "'rm:-5:5'; '' = none"),
    # --- the LLM judge: reward source 'judge' (rljax.rewards.judge) ------------------------------
    Key("reward.judge.source", "policy", NONEMPTY,
        "the judge's weights: 'policy' (the policy's own at step 0: model.source) | 'hf:PATH' | "
        "'run:DIR' (DIR/hf); it reads text with the run's tokenizer (data.tokenizer)",
        read_if=REWARD_SOURCE_READS),
    Key("reward.judge.template", "question: {prompt}\nanswer: {completion}\nscore: ",
        parsed(judge_template, "a template naming {prompt} and {completion}"),
        "the judge's prompt, a str.format template over the row's prompt and completion (as "
        "prompts are: chat template, BOS)", read_if=REWARD_SOURCE_READS),
    Key("reward.judge.parse", "number", choice("number", "p_yes"),
        "verdict -> score: number (the first match of reward.judge.pattern in the judge's "
        "generated verdict, clipped to reward.judge.range) | p_yes (P(reward.judge.yes) of the "
        "judge's next token after the template, no sampling)", read_if=REWARD_SOURCE_READS),
    Key("reward.judge.pattern", r"-?\d+(?:\.\d+)?",
        parsed(judge_pattern, "a regular expression"),
        "parse=number: the verdict's score is the first match (its group 1 if it has groups)",
        read_if=JUDGE_NUMBER),
    Key("reward.judge.range", (0.0, 10.0),
        Check(lambda v: isinstance(v, (tuple, list)) and len(v) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) < float("inf")
            for x in v) and v[0] < v[1], "(lo, hi) finite numbers with lo < hi", tuple),
        "parse=number: a parsed score is clipped to [lo, hi]", read_if=JUDGE_NUMBER),
    Key("reward.judge.fallback", 0.0, real(),
        "parse=number: the score of a verdict without a number (counted in "
        "reward/judge_unparsable)", read_if=JUDGE_NUMBER),
    Key("reward.judge.yes", " yes", NONEMPTY,
        "parse=p_yes: the text whose probability is the score; one token of the run's "
        "tokenizer (e.g. 'y' with the char tokenizer)", read_if=REWARD_SOURCE_READS & equals(
            "reward.judge.parse", "p_yes")),
    Key("reward.judge.engine", "all_rows", registered("rollout_engine"),
        "parse=number: the rollout engine that generates the verdicts (rollout.engine's "
        "registry; one device, unsharded)", read_if=JUDGE_NUMBER),
    Key("reward.judge.max_new_tokens", 8, SIZE, "parse=number: the verdict's length in tokens",
        read_if=JUDGE_NUMBER),
    Key("reward.judge.greedy", True, BOOL,
        "parse=number: greedy verdicts; False = sampled at reward.judge.temperature (the key "
        "drawn from the run's seed and the batch's tokens: a resumed run draws the same)",
        read_if=JUDGE_NUMBER),
    Key("reward.judge.temperature", 1.0, POSITIVE, "parse=number, sampled verdicts: temperature",
        read_if=JUDGE_NUMBER & equals("reward.judge.greedy", False)),
    # --- the RLHF demo's gold scorer: reward source 'gold' (rljax.rewards.gold) ----------------
    Key("reward.gold.pairs", 0, integer(0, 10**7),
        "the RLHF demo's cold start (configs/tasks/rlhf.py): when > 0 and reward.model.source="
        "'run:DIR' holds no export yet, the gold scorer labels this many preference pairs of the "
        "embedded task into rm.train_file (kept if it exists) and `rljax rm` trains the reward "
        "model into DIR first (rm.*, model.*), as model.source='sft' is trained first; 0 = off",
        read_if=REWARD_SOURCE_READS),
    Key("reward.workers", 4, integer(0, 1024),
        "verifier worker processes; 0 = the verifier runs in the trainer's process (no process "
        "round trip per call, no timeout: for fast verifiers one trusts, e.g. exact_match)"),
    Key("reward.max_logged_failures", 100, integer(0),
        "failed calls sampled into run_dir/reward_failures.jsonl (a multi-turn run's failed "
        "episodes: run_dir/env_failures.jsonl)"),
    Key("reward.max_worker_memory_mb", 2048, integer(0),
        "address space a verifier worker may add to what it inherited (MB; RLIMIT_AS); 0 = no "
        "limit", read_if=VERIFIER_PROCESSES),
    Key("reward.worker_max_calls", 0, integer(0),
        "replace a verifier worker after this many calls (a leak's bound); 0 = never",
        read_if=VERIFIER_PROCESSES),
    # --- scalar reward model as a reward (docs/reward_models.md) -------------------------------
    Key("reward.model.source", "", STRING,
        "reward source 'rm': 'hf:PATH' (a *ForSequenceClassification directory, one label) | "
        "'run:DIR[@STEP]' (an `rljax rm` run: its export DIR/hf, or DIR/exports/STEP)",
        read_if=REWARD_SOURCE_READS),
    Key("reward.model.tokenizer", "", STRING,
        "the reward model's tokenizer: '' = its own (the hf: directory's tokenizer files, the "
        "rm run's data.tokenizer) | 'char' | a local Hugging Face tokenizer directory; the "
        "policy's ids are reused when it is the policy's, else the text is re-encoded",
        read_if=REWARD_SOURCE_READS),
    Key("reward.model.chat_template", False, BOOL,
        "render prompts with the reward model tokenizer's chat template",
        read_if=REWARD_SOURCE_READS),
    Key("reward.model.batch_size", 0, integer(0),
        "rows per reward-model forward (rounded up to a multiple of the data-parallel width); "
        "0 = the whole batch in one", read_if=REWARD_SOURCE_READS),
    Key("reward.model.dtype", "", choice("", *DTYPES),
        "reward-model compute dtype; '' = model.dtype (bfloat16 on accelerators)",
        read_if=REWARD_SOURCE_READS),
    # --- multi-turn environment (docs/multiturn.md) -------------------------------------------
    Key("env.name", None, optional(registered("environment")),
        "None = single-turn rollouts scored by reward.fn | a registered environment: multi-turn "
        "rollouts (turns of at most rollout.max_new_tokens, tool calls, observations) scored by "
        "it | a registered agent harness (env.engine='endpoint'): episodes played by agent code "
        "through an OpenAI-compatible endpoint (docs/agents.md)"),
    Key("env.max_turns", 4, integer(1, 10**4),
        "most policy turns per episode (endpoint: calls; one more is refused); an episode still "
        "running after them ends unsolved",
        read_if=MULTI_TURN),
    Key("env.max_tokens", 256, SIZE,
        "token budget of a trajectory after its prompt (policy and environment tokens): the "
        "record's T; a trajectory that reaches it ends, flagged truncated", read_if=MULTI_TURN),
    Key("env.timeout_s", 5.0, POSITIVE,
        "per reset / step call in its worker process (reward.workers of them; endpoint: per "
        "episode, its whole harness): a hard bound, the trajectory of a call past it (or "
        "crashing) ends with reward 0, counted",
        read_if=MULTI_TURN),
    Key("env.tool_format", "compact", choice("compact", "hermes"),
        "how tool calls are written: compact '<calc 12*3>' (char-level tasks) | hermes "
        "'<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>' (Qwen / Hermes; with "
        "data.chat_template a turn is a whole assistant message, answered by the chat "
        "template's tool messages)", read_if=MULTI_TURN),
    Key("env.engine", "turn_sync", registered("episode_engine"),
        "turn_sync: every turn is one sampler call over the live rows, then every step (a turn "
        "waits for its slowest row and tool) | async_turns: a row whose turn ends steps its "
        "environment while the others decode, and re-enters with its KV cache kept "
        "(rljax/envs/async_turns.py) | endpoint: agent harnesses (env.name) call an "
        "OpenAI-compatible endpoint, their calls continuously batched (rljax/agents/driver.py)",
        read_if=MULTI_TURN),
    Key("env.turn_discount", 1.0, FRACTION,
        "token-level estimators (gae, reinforce_pp, remax): < 1 puts each turn's reward at its "
        "last policy token, discounted per turn (a token of turn k sees sum_j>=k d^(j-k) r_j); "
        "1 = the episode's summed reward on its last token",
        read_if=MULTI_TURN & meta_says("algo.advantage", _token_level, "a token-level estimator",
                                      _one_reward_per_episode)),
    Key("env.slots", 0, integer(0, 2**31 - 1),
        "async_turns / endpoint engines: rows decoding at once (lanes); 0 = every row of the "
        "batch (a call narrows to S/8, S/4 or S/2 lanes when that holds the rows decoding or "
        "ready to)",
        read_if=MULTI_TURN & DRIVER_READS),
    Key("env.harness_workers", 16, integer(1, 4096),
        "endpoint engine: processes running agent harnesses, the episodes in flight at once",
        read_if=MULTI_TURN & DRIVER_READS),
    # --- algorithm (sections 2-5, 7) -----------------------------------------------------------
    Key("algo.advantage", "grpo", registered("advantage"), "advantage estimator"),
    Key("algo.adv_std", "group", choice("group", "batch", "none"),
        "grpo/passk_n: divide by the std of the group | batch | none", read_if=COMPONENT),
    Key("algo.adv_whiten", False, BOOL, "whiten advantages over the batch",
        read_if=meta_says("algo.advantage", lambda m: not m.get("whitened"),
                          "an estimator that does not whiten by definition") | COMPONENT),
    Key("algo.gamma", 1.0, FRACTION, "discount", read_if=COMPONENT),
    Key("algo.lam", 0.95, FRACTION, "GAE lambda (the policy's)", read_if=COMPONENT),
    Key("algo.lam_critic", None, optional(FRACTION), "GAE lambda of critic targets; None = lam",
        read_if=COMPONENT),
    Key("algo.lam_alpha", None, optional(real(0, lo_open=True)),
        "VAPO length-adaptive lambda = 1 - 1/(alpha l); None = off (VAPO 0.05)", read_if=COMPONENT),
    Key("algo.policy_loss", "ppo", registered("policy_loss"), "policy objective"),
    Key("algo.clip_eps_low", 0.2, real(0, 1), "PPO clip: ratio >= 1 - eps_low", read_if=COMPONENT),
    Key("algo.clip_eps_high", 0.2, NONNEG, "PPO clip: ratio <= 1 + eps_high (DAPO 0.28)",
        read_if=COMPONENT),
    Key("algo.dual_clip_c", None, optional(real(1, lo_open=True)),
        "dual-clip PPO: for A < 0 the loss is at most -A c; None = off", read_if=COMPONENT),
    Key("algo.cispo_eps_high", 4.0, NONNEG, "CISPO: IS weight <= 1 + eps_high", read_if=COMPONENT),
    Key("algo.cispo_eps_low", None, optional(NONNEG),
        "CISPO: IS weight >= 1 - eps_low; None = no lower bound", read_if=COMPONENT),
    Key("algo.gmpo_eps", 0.4, real(0, lo_open=True), "GMPO: log-ratio clip", read_if=COMPONENT),
    Key("algo.loss_agg", "seq_mean_token_mean", registered("loss_agg"), "loss aggregation",
        read_if=meta_says("algo.policy_loss", lambda m: not m.get("loss_agg"),
                          "an objective that does not force its own aggregation") | COMPONENT),
    Key("algo.loss_norm_constant", None, optional(real(0, lo_open=True)),
        "seq_mean_token_sum_norm's constant; None = rollout.max_new_tokens",
        read_if=When(lambda f, k: "seq_mean_token_sum_norm" in _agg_modes(f.algorithm),
                     "algo.loss_agg='seq_mean_token_sum_norm'",
                     needs=frozenset({"algorithm"})) | COMPONENT),
    Key("algo.kl_estimator", "k3", registered("kl_estimator"), "KL estimator",
        read_if=KL_TERM | COMPONENT),
    Key("algo.kl_placement", "loss", choice("loss", "reward", "none"),
        "KL to the reference: in the loss | in the reward | none (no reference model)"),
    Key("algo.kl_coef", 0.04, NONNEG, "KL weight beta (initial, with kl_target)",
        read_if=COMPONENT),
    Key("algo.kl_target", None, optional(real(0, lo_open=True)),
        "adaptive KL (Ziegler et al.): target KL; None = fixed coefficient", read_if=COMPONENT),
    Key("algo.kl_horizon", 10000, integer(1), "adaptive KL: horizon in rows", read_if=COMPONENT),
    Key("algo.ref_update", "frozen", choice("frozen", "ema"),
        "reference model: frozen | ema of the policy (T1)", read_if=KL_TERM | COMPONENT),
    Key("algo.ref_ema_decay", 0.99, FRACTION, "EMA reference: decay d",
        read_if=(KL_TERM & equals("algo.ref_update", "ema")) | COMPONENT),
    Key("algo.kl_normalize", False, BOOL,
        "T1's normalised KL: the KL term's aggregation is token_mean",
        read_if=equals("algo.kl_placement", "loss") | COMPONENT),
    Key("algo.router_aux_coef", None, optional(NONNEG),
        "MoE load-balancing loss weight (Switch Transformer); None = the checkpoint's "
        "router_aux_loss_coef (0 without MoE layers)", read_if=MOE_MODEL),
    Key("algo.entropy_coef", 0.0, real(), "entropy bonus weight (8.7: the controller's c_0)",
        read_if=COMPONENT),
    Key("algo.pos_lm_coef", 0.0, NONNEG, "VAPO: LM loss weight on positive examples",
        read_if=COMPONENT),
    Key("algo.overlong_filter", False, BOOL, "truncated completions get no loss (DAPO ablation)"),
    Key("algo.dynamic_sampling", False, BOOL,
        "DAPO: resample until P groups with a reward spread are kept"),
    Key("algo.max_gen_batches", 10, integer(1, 10**6), "dynamic sampling: most rounds per step",
        read_if=DYNAMIC_SAMPLING | COMPONENT),
    Key("algo.keep_pass_rate", None, PASS_RATE_WINDOW,
        "dynamic sampling: keep groups whose pass rate is in [lo, hi]; None = a reward spread",
        read_if=DYNAMIC_SAMPLING | COMPONENT),
    Key("algo.selective_rollout", False, BOOL,
        "GRESO: skip a drawn prompt before sampling, with probability 1 - p^z after z groups "
        "in a row of all-correct (or all-wrong) completions"),
    Key("algo.skip_target", 0.25, FRACTION,
        "selective rollouts: the share of zero-spread groups among a step's sampled groups the "
        "exploration probabilities p steer to (1/3 all-correct, 2/3 all-wrong)",
        read_if=SELECTIVE),
    Key("algo.skip_explore", 0.5, real(0.05, 0.95),
        "selective rollouts: the exploration probabilities p_easy = p_hard at step 0",
        read_if=SELECTIVE),
    Key("algo.epochs", 1, integer(1, 10**6), "passes over each rollout batch"),
    Key("algo.minibatches", 1, integer(1, 10**6), "optimizer steps per epoch"),
    Key("algo.micro_batches", 1, integer(1, 10**6),
        "gradient accumulation inside each minibatch (exact aggregation)"),
    Key("algo.old_logp", "recompute", choice(*OLD_LOGP_SOURCES),
        "the PPO ratio's old log-probs: recompute (a policy forward over the batch before the "
        "update, at the weights it starts from) | sampler (Rollout.sampler_logp, the sampler's "
        "temperature-1 log-prob of each sampled token: no scoring forward; the ratio is against "
        "the policy that sampled, also when rollout.max_staleness > 0 or the sampler's dtype or "
        "weights differ; entropy, logp_gap, kl and mismatch/ then come from the update's "
        "forwards, each minibatch's at the weights its update starts from)"),
    Key("algo.tis_cap", None, optional(real(0, lo_open=True)),
        "alias of rollout_is='token' with rollout_is_cap=tis_cap (not both); None = off",
        read_if=COMPONENT),
    # --- section 8 -----------------------------------------------------------------------------
    Key("algo.sapo_tau_pos", 1.0, POSITIVE, "SAPO gate temperature where A > 0", read_if=COMPONENT),
    Key("algo.sapo_tau_neg", 1.05, POSITIVE, "SAPO gate temperature where A <= 0",
        read_if=COMPONENT),
    Key("algo.sapo_level", "token", choice("token", "sequence"),
        "SAPO: gate on the token ratio | on GSPO's sequence ratio", read_if=COMPONENT),
    Key("algo.clip_cov_ratio", 2e-4, real(0, 1, lo_open=True),
        "Clip-Cov: share of the minibatch's valid tokens zeroed", read_if=COMPONENT),
    Key("algo.clip_cov_lb", 1.0, real(), "Clip-Cov candidates: lb < token covariance",
        read_if=COMPONENT),
    Key("algo.clip_cov_ub", 5.0, real(), "Clip-Cov candidates: token covariance < ub",
        read_if=COMPONENT),
    Key("algo.kl_cov_ratio", 2e-3, real(0, 1, lo_open=True),
        "KL-Cov: share of valid tokens (top covariance) given |delta|", read_if=COMPONENT),
    Key("algo.kl_cov_coef", 1.0, NONNEG, "KL-Cov: weight of |delta| on the selected tokens",
        read_if=COMPONENT),
    Key("algo.passk_k", None, optional(integer(1, 2**31 - 1)),
        "pass@k training's k; must be set with advantage='passk'", read_if=COMPONENT),
    Key("algo.rollout_is", "none", choice(*ROLLOUT_LEVELS),
        "rollout IS weights sampler -> old: none | token | sequence | geometric",
        read_if=COMPONENT),
    Key("algo.rollout_is_cap", 2.0, POSITIVE, "rollout IS: upper truncation", read_if=COMPONENT),
    Key("algo.rollout_is_over_cap", "truncate", choice("truncate", "mask"),
        "rollout IS, a ratio above the cap: truncate (weight = cap; TIS, verl) | mask (weight 0, "
        "the token still counted in the loss's denominator; AReaL's decoupled objective)",
        read_if=COMPONENT),
    Key("algo.rollout_is_floor", None, optional(NONNEG), "rollout IS: lower truncation; None = none",
        read_if=COMPONENT),
    Key("algo.rollout_is_batch_norm", False, BOOL, "rollout IS: divide by the batch mean",
        read_if=COMPONENT),
    Key("algo.rollout_rs", "none", choice(*ROLLOUT_LEVELS),
        "rollout rejection: none | token | sequence | geometric", read_if=COMPONENT),
    Key("algo.rollout_rs_lo", 0.0, optional(NONNEG), "rollout rejection: keep ratios >= lo",
        read_if=COMPONENT),
    Key("algo.rollout_rs_hi", None, optional(NONNEG), "rollout rejection: keep ratios <= hi",
        read_if=COMPONENT),
    Key("algo.rollout_rs_veto", None, optional(real(0, lo_open=True)),
        "reject a row with any token ratio below this; None = off", read_if=COMPONENT),
    Key("algo.rollout_rs_k3", None, optional(NONNEG),
        "reject a row whose mean k3(rho) exceeds this; None = off"),
    Key("algo.entropy_top_rho", 1.0, NONNEG,
        "80/20: only the top-rho highest-entropy tokens train; 1 = off", read_if=COMPONENT),
    Key("algo.entropy_mask_source", "old", choice("old", "current"),
        "80/20 mask entropy: old (H_old of the scoring forward; 'current' is not implemented)",
        read_if=COMPONENT),
    Key("algo.entropy_ctrl", False, BOOL,
        "Skywork-OR1 adaptive entropy coefficient (starts at entropy_coef)", read_if=COMPONENT),
    Key("algo.entropy_target", 0.2, real(), "entropy controller: bonus on below this entropy",
        read_if=COMPONENT),
    Key("algo.entropy_coef_delta", 1e-4, NONNEG, "entropy controller: step per RL step",
        read_if=COMPONENT),
    Key("algo.entropy_coef_min", 0.0, real(), "entropy controller: lower clip", read_if=COMPONENT),
    Key("algo.entropy_coef_max", 0.005, real(), "entropy controller: upper clip",
        read_if=COMPONENT),
    Key("algo.entropy_ctrl_estimate", "full", choice("full", "sampled"),
        "entropy controller's measure: full (mean H of the update) | sampled (-mean old_logp)",
        read_if=COMPONENT),
    Key("algo.opd_coef", 0.0, NONNEG,
        "on-policy distillation: weight of -reverse KL to the teacher; 0 = off", read_if=COMPONENT),
    Key("algo.opd_discount", 0.0, FRACTION,
        "on-policy distillation: discount of the future reverse KL; 0 = per token",
        read_if=COMPONENT),
    Key("algo.opd_length_norm", False, BOOL,
        "on-policy distillation: divide the discounted sum by its discounted count (MiniLLM)",
        read_if=COMPONENT),
    Key("algo.opd_student_logp", "old", choice("old", "sampler"),
        "on-policy distillation: student log-prob in the reverse KL", read_if=COMPONENT),
    # --- teacher of on-policy distillation (algo.opd_coef > 0) ---------------------------------
    Key("teacher.source", "", STRING,
        "'' = none | 'hf:PATH' | 'run:DIR' (DIR/hf) | 'sft' (sft.out_dir) | 'tiny' (random, "
        "seed + 1: for tests); same tokenizer as the policy",
        read_if=above("algo.opd_coef", 0, "there is no distillation (algo.opd_coef=0)")),
    Key("teacher.dtype", "", choice("", *DTYPES), "teacher compute dtype; '' = model.dtype",
        read_if=above("algo.opd_coef", 0, "there is no distillation (algo.opd_coef=0)")),
    # --- critic (section 6) --------------------------------------------------------------------
    Key("critic.enabled", False, BOOL, "train a value model (PPO, VC-PPO, VAPO, ORZ)"),
    Key("critic.lr", 1e-5, POSITIVE, "critic learning rate", read_if=CRITIC),
    Key("critic.value_clip", 0.5, NONNEG, "value clip around the old values", read_if=CRITIC),
    Key("critic.pretrain_steps", 0, integer(0, 10**6),
        "value pretraining steps on Monte-Carlo returns before RL (VC-PPO)", read_if=CRITIC),
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
    Key("train.loggers", ("jsonl", "tensorboard"), registered_tuple("logger", required=("jsonl",)),
        "where metrics go: jsonl (run_dir/metrics.jsonl, always on) | tensorboard | wandb | "
        "mlflow (docs/integrations.md)"),
    Key("train.tracker_project", "rljax", NONEMPTY,
        "wandb/mlflow loggers: the W&B project, the MLflow experiment", read_if=LOGGER_READS),
    Key("train.tracker_run_name", "", STRING,
        "wandb/mlflow loggers: the run's name; '' = the run dir's name", read_if=LOGGER_READS),
    Key("train.tracker_group", "", STRING,
        "wandb/mlflow loggers: the W&B group, the MLflow tag rljax.group ('' = none); "
        "`rljax sweep` sets it to the study's name", read_if=LOGGER_READS),
    Key("train.tracker_tags", (), STRING_TUPLE, "wandb/mlflow loggers: the run's tags",
        read_if=LOGGER_READS),
    Key("train.mlflow_tracking_uri", "", STRING,
        "mlflow logger: the tracking server or store; '' = MLflow's own default "
        "(MLFLOW_TRACKING_URI)", read_if=LOGGER_READS),
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
    Key("sft.seed", 1234, SEED, "the cold start's init and its stream of SFT examples (of the "
        "train split); not the run's seed, so every seed of a study starts from one cold start"),
    Key("sft.stop_match", 0.0, real(0.0, 1.0),
        "stop SFT at the first check where this share of held-aside train problems is solved "
        "exactly by greedy decoding (teacher-forced argmax = the reference at every learned "
        "token); 0 = train all sft.steps. Gives every sft.seed a cold start of the same skill"),
    Key("sft.check_every", 10, integer(1), "SFT steps between exact-match checks",
        read_if=SFT_STOP),
    Key("sft.check_size", 256, SIZE, "problems of the exact-match check (their own stream of "
        "the train split, never the eval split)",
        read_if=SFT_STOP),
    Key("sft.out_dir", "runs/sft", NONEMPTY,
        "reused when it holds the cold start of the same sft/model/data keys; one of "
        "other keys is kept, and this run's goes beside it in <sft.out_dir>-<hash of the keys>"),
    # --- reward-model training (`rljax rm`, docs/reward_models.md) -----------------------------
    Key("rm.train_file", "", STRING,
        "`rljax rm`: JSONL preference pairs, one {\"prompt\", \"chosen\", \"rejected\"} per line"),
    Key("rm.eval_file", "", STRING,
        "`rljax rm`: held-out pairs for the pairwise accuracy; '' = rm.eval_fraction of "
        "rm.train_file"),
    Key("rm.eval_fraction", 0.1, real(0.0, 1.0),
        "`rljax rm`: share of rm.train_file held out (at least one pair)",
        read_if=equals("rm.eval_file", "", "rm.eval_file names the held-out pairs")),
    Key("rm.steps", 200, integer(1, 10**9), "`rljax rm`: optimizer steps (lr etc.: optim.*)"),
    Key("rm.batch_size", 16, SIZE, "`rljax rm`: preference pairs per step"),
    Key("rm.max_tokens", 256, SIZE,
        "`rljax rm`: the longest scored row (prompt, response, EOS), bound by the model's "
        "context; a longer pair is an error naming its line. Batches are padded to their own "
        "longest row"),
    Key("rm.eval_every", 0, integer(0),
        "`rljax rm`: held-out pairwise accuracy every N steps; 0 = before and after"),
    # --- device mesh ---------------------------------------------------------------------------
    Key("mesh.data", -1, MESH_AXIS, "data-parallel axis; -1 = the devices the others leave"),
    Key("mesh.fsdp", 1, MESH_AXIS, "fully sharded data-parallel axis"),
    Key("mesh.expert", 1, MESH_AXIS,
        "expert-parallel axis: MoE expert weights split by expert; batch rows split over it too, "
        "other weights replicated"),
    Key("mesh.context", 1, MESH_AXIS,
        "context-parallel axis: every sequence of the update, the scoring and the rollout (its "
        "KV cache) split over it, attention by a striped ring (docs/scale_out.md); weights split "
        "over it as over fsdp"),
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
))

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
