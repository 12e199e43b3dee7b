"""Every config key, declared once: default, allowed values, when it is read, one line of doc.

``rljax.config()`` / ``get_config()`` builds the default ConfigDict from ``KEYS``;
``rljax.config_checks`` checks every value against its declaration at start-up, refuses a key set
away from its default that nothing reads, and checks ``RELATIONS``; ``rljax keys`` prints them and
``docs/config.md`` is generated from them (``python -m rljax keys --markdown``). A preset
(``configs/<algo>.py``) changes only what makes that algorithm. Override anything on the command
line with ``--config.section.key=value``.

The format (``rljax.keys``), one line per fact::

  Key("section.name", default, check, "one line of doc"[, read_if=WHEN])

- ``check``: what the value may be: ``BOOL``, ``SIZE``, ``integer(lo, hi)``, ``real(lo, hi)``,
  ``choice(...)``, ``registered("advantage")`` (a registered component), ``optional(...)``.
  Components take a choice key's values from here (``options("model.router_replay")``).
- ``read_if``: when the run reads the key (default ``ALWAYS``). A key whose condition is false
  must keep its default, or the run stops naming it and the reason (``When.unless``). Conditions:
  ``equals(key, v)``, ``differs(key, v)``, ``above(key, v)``, ``meta_says(key, test, says)`` (the
  component a key names declares something), ``component_reads()`` (an ``algo.*``
  hyperparameter, read when a resolved component binds it: its registration names the key), the
  named ones below (``CRITIC``, ``MULTI_TURN``, ...), combined with ``&`` and ``|``.
- Constraints between keys are ``Relation``s in ``RELATIONS`` at the end of the file.

This module sits at the bottom of the package (it imports only ``rljax.keys``): models and
components read their choices from it, and it registers nothing by being read.
"""
import re
import string

import ml_collections
from ml_collections.config_dict import placeholder

from rljax.keys import (ADAM_BETA, ALWAYS, BOOL, FRACTION, KEY_TUPLE, NONEMPTY, NONNEG,
                        PASS_RATE_WINDOW, POSITIVE, SEED, SIZE, STRING, Check, Facts, Key,
                        Relation,
                        When, above, choice, component_reads, declare, differs, equals,
                        integer, meta_says, optional, parsed, real, registered, registry_meta,
                        registry_names)

DTYPES = ("float32", "bfloat16", "float16")
ROLLOUT_LEVELS = ("none", "token", "sequence", "geometric")
OLD_LOGP_SOURCES = ("recompute", "sampler")  # algo.old_logp
REMAT_MODES = ("none", "full", "dots")  # model.remat; True/False of old configs: full/none
MESH_AXES = ("data", "fsdp", "expert", "tensor")  # the mesh's axes, in its device order
MESH_AXIS = integer(1, also=(-1,))  # any one axis may be -1: the devices the others leave
MODEL_DIM = integer(1, 2**20)  # a model dimension; larger ones overflow int32 shapes, never fit
STRING_TUPLE = Check(lambda v: isinstance(v, (tuple, list)) and all(isinstance(t, str) for t in v),
                     "a tuple of strings", tuple)
# The names themselves are checked by rljax.models.lora.resolve_targets (one line naming them).
LORA_TARGETS = Check(lambda v: isinstance(v, (tuple, list)) and len(v) > 0
                     and all(isinstance(t, str) for t in v),
                     "a non-empty tuple of projection names, or ('all',)", tuple)
# The names themselves are looked up in rljax.train.trackers.LOGGERS at start-up.
LOGGER_NAMES = Check(lambda v: isinstance(v, (tuple, list)) and "jsonl" in v
                     and all(isinstance(n, str) for n in v),
                     "a tuple of logger names that includes 'jsonl'", tuple)

# ``model.pack='auto'`` (``rljax.train.packing.packs``): a forward packs when its packed layout
# has at least this many chunks, on these platforms. Packing saves work only by the chunks the
# batch leaves empty; in one chunk it adds the layout's gathers and saves nothing: at rows of 256
# tokens the update in one chunk ran 0.85x packed and scoring in two 2.1x (same rows, same
# process); from two chunks the step's saving repays the packed program's longer compilation
# within tens of steps (docs/results/benchmarks_packing.md, "When packing pays"). Measured on CPUs
# only: on GPUs cuDNN attention holds one sequence a row (packed rows fall back to the blockwise
# kernel), and with no token limit (auto there) a forward is one chunk anyway.
AUTO_PACK_MIN_CHUNKS = 2
AUTO_PACK_PLATFORMS = ("cpu",)

# --- when keys are read --------------------------------------------------------------------------
COMPONENT = component_reads()
CRITIC = equals("critic.enabled", True, "there is no critic (critic.enabled=False)")
KL_TERM = differs("algo.kl_placement", "none")
DYNAMIC_SAMPLING = equals("algo.dynamic_sampling", True)
SELECTIVE = equals("algo.selective_rollout", True)
OVERLONG_SHAPING = differs("reward.overlong_buffer", 0,
                           "the overlong punishment is off (reward.overlong_buffer=0)")
SINGLE_TURN = equals("env.name", None, lambda f, k: (
    f"env.name={f['env.name']!r} scores the episodes (its steps run under env.timeout_s in the "
    "reward.workers processes)"))
VERIFIER_PROCESSES = above("reward.workers", 0, "reward.workers=0: the verifier runs in the "
                           "trainer's process")
MULTI_TURN = differs("env.name", None, "rollouts are single-turn (env.name=None); set env.name "
                                       "to an environment or drop the key")
LORA = above("model.lora.rank", 0, "model.lora.rank=0 (no adapters)")
SFT_STOP = above("sft.stop_match", 0.0, "sft.stop_match=0 (SFT trains all sft.steps)")
FRESH_MODEL = When(lambda f, k: f["model.source"] in ("tiny", "sft"),
                   "model.source='tiny' or 'sft'", lambda f, k: (
                       f"model.source={f['model.source']!r} brings its own architecture"))


def logger_on(*names: str) -> When:
  """``train.loggers`` names one of ``names`` (the trackers that read a ``train.*`` key)."""
  says = " or ".join(f"'{n}'" for n in names)
  return When(lambda f, k: bool(set(names) & set(f["train.loggers"])),
              f"train.loggers naming {says}", lambda f, k: (
                  f"it is read by the {' and '.join(names)} logger{'s' if len(names) > 1 else ''}"
                  f", and train.loggers={tuple(f['train.loggers'])!r} names none"))


TRACKERS = ("wandb", "mlflow")  # the loggers that keep a run on a tracking service
TRACKED = logger_on(*TRACKERS)
# data.source kinds whose keys only they read (rljax.data.datasets parses the source).
REASONING_GYM = "reasoning_gym"
GYM_SOURCE = When(lambda f, k: f["data.source"].startswith(REASONING_GYM + ":"),
                  f"data.source='{REASONING_GYM}:NAME'", lambda f, k: (
                      f"data.source={f['data.source']!r} is not a {REASONING_GYM}: source"))
EMBEDDED_SOURCE = When(lambda f, k: not f["data.source"].startswith(REASONING_GYM + ":"),
                       "a data.source other than reasoning_gym", lambda f, k: (
                           f"data.source={f['data.source']!r} reads its generators' settings "
                           "from data.reasoning_gym.config"))
# data.source='verifiers:ID' with env.name='verifiers' (rljax/envs/verifiers_env.py).
VERIFIERS = "verifiers"
VERIFIERS_SOURCE = When(lambda f, k: f["data.source"].startswith(VERIFIERS + ":"),
                        f"data.source='{VERIFIERS}:ID'", lambda f, k: (
                            f"data.source={f['data.source']!r} is not a {VERIFIERS}: source"))
MOE_MODEL = When(lambda f, k: bool(f.model.moe_layers), "a model with MoE layers",
                 lambda f, k: (f"model.source={f['model.source']!r} is a {f.model.model_type} "
                               "model without MoE layers"), frozenset({"model"}))


def _token_level(meta) -> bool:
  return "token_rewards" in meta["inputs"]


def _one_reward_per_episode(f, k) -> str:
  readers = [n for n in registry_names("advantage") if _token_level(registry_meta("advantage", n))]
  return (f"algo.advantage={f['algo.advantage']!r} reads one reward per episode; the token-level "
          f"estimators read it ({', '.join(readers)})")


def _agg_modes(algorithm) -> set:
  return {algorithm.policy_agg} | {r.agg for r in algorithm.regularizers}


# --- reward composition (docs/reward_models.md): parsed here, composed by rljax.rewards.sources --
# The task's own source: it always runs (its correct flags are the run's accuracy and eval's
# pass@1) and is the whole reward when reward.sources is ''.
VERIFIER_SOURCE, ENV_SOURCE = "verifier", "env"  # single-turn rollouts, multi-turn episodes
NORMALIZATIONS = ("whiten",)


def _terms(text, fields: str) -> list:
  """``'a:x,b:y'`` -> ``[('a', ['x']), ('b', ['y'])]``: each term a name and the ``fields``
  (e.g. ``'weight'``, ``'lo:hi'``) after it; every name once. ValueError names the bad term."""
  if not isinstance(text, str):
    raise ValueError(f"got {type(text).__name__} {text!r}, not a string")
  width = len(fields.split(":"))
  terms, seen = [], set()
  for term in (t.strip() for t in text.split(",")) if text.strip() else ():
    name, *rest = [part.strip() for part in term.split(":")]
    if not name or len(rest) != width:
      raise ValueError(f"term {term!r} is not 'name:{fields}'")
    if name in seen:
      raise ValueError(f"{name!r} is named twice")
    seen.add(name)
    terms.append((name, rest))
  return terms


def _number(text: str, term: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise ValueError(f"{term}: {text!r} is not a number") from None
  if value != value or value in (float("inf"), float("-inf")):
    raise ValueError(f"{term}: {text!r} is not finite")
  return value


def reward_weights(text: str) -> dict:
  """``reward.sources``: ``'verifier:1.0,judge:0.5'`` -> ``{'verifier': 1.0, 'judge': 0.5}``
  (``''`` -> ``{}``: the task's own source alone). Names must be registered reward sources."""
  weights = {name: _number(w, f"weight of {name!r}") for name, (w,) in _terms(text, "weight")}
  if weights:
    known = registry_names("reward_source")
    unknown = [n for n in weights if n not in known]
    if unknown:
      raise ValueError(f"{unknown[0]!r} is not a registered reward source; registered: "
                       f"{', '.join(known)}")
    if not any(weights.values()):
      raise ValueError("every weight is 0: nothing would be optimised")
  return weights


def reward_normalize(text: str) -> dict:
  """``reward.normalize``: ``'judge:whiten'`` -> ``{'judge': 'whiten'}``."""
  out = {name: how for name, (how,) in _terms(text, "how")}
  for name, how in out.items():
    if how not in NORMALIZATIONS:
      raise ValueError(f"{name}:{how}: the normalisation must be one of {list(NORMALIZATIONS)}")
  return out


def reward_clip(text: str) -> dict:
  """``reward.clip``: ``'rm:-5:5'`` -> ``{'rm': (-5.0, 5.0)}`` (after whitening, if any)."""
  out = {}
  for name, (lo, hi) in _terms(text, "lo:hi"):
    lo, hi = _number(lo, f"{name} lo"), _number(hi, f"{name} hi")
    if not lo < hi:
      raise ValueError(f"{name}:{lo}:{hi} needs lo < hi")
    out[name] = (lo, hi)
  return out


def task_source(f) -> str:
  """The task's own reward source: the verifier, or the environment of multi-turn episodes."""
  return VERIFIER_SOURCE if f["env.name"] is None else ENV_SOURCE


def composed_sources(f) -> dict:
  """``{name: weight}`` of the run's reward: ``reward.sources``, or the task's source alone."""
  return reward_weights(f["reward.sources"]) or {task_source(f): 1.0}


def judge_template(text) -> str:
  """``reward.judge.template``: a ``str.format`` template naming ``{prompt}`` and
  ``{completion}`` and nothing else (literal braces doubled)."""
  if not isinstance(text, str):
    raise ValueError(f"got {type(text).__name__}, not a string")
  try:
    fields = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
  except ValueError as e:
    raise ValueError(f"not a format template ({e})") from None
  missing = {"prompt", "completion"} - fields
  if missing or fields - {"prompt", "completion"}:
    raise ValueError(f"it names {sorted(fields) or 'no field'}; expected exactly {{prompt}} and "
                     "{completion}")
  return text


def judge_pattern(text) -> str:
  """``reward.judge.pattern``: a regular expression whose first match is read as a number."""
  try:
    re.compile(text)
  except (re.error, TypeError) as e:
    raise ValueError(f"not a regular expression ({e})") from None
  return text


def named_source(name: str) -> When:
  """``reward.sources`` names the source ``name`` (its keys are read only then)."""
  return When(lambda f, k: name in composed_sources(f), f"'{name}' in reward.sources",
              lambda f, k: f"reward.sources={f['reward.sources']!r} does not name '{name}'")


JUDGE = named_source("judge")
REWARD_MODEL_SOURCE = "rm"  # the learned scalar reward model (rljax.rewards.reward_model)
RM_SOURCE = named_source(REWARD_MODEL_SOURCE)
JUDGE_NUMBER = JUDGE & equals("reward.judge.parse", "number")

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
        "force it"),
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
    Key("data.source", "embedded:arithmetic", NONEMPTY,
        "'embedded:arithmetic' | 'embedded:countdown' | 'reasoning_gym:NAME[,NAME...]' "
        "(reasoning-gym tasks, extra [reasoning_gym]) | 'verifiers:ID' (a verifiers environment's "
        "dataset, with env.name='verifiers'; extra [verifiers]) | 'jsonl:PATH' | 'hf:PATH' "
        "(local datasets files)"),
    Key("data.difficulty", 1, integer(0, 1000), "embedded tasks: problem difficulty",
        read_if=EMBEDDED_SOURCE),
    Key("data.train_seed", 0, SEED, "generated tasks: seed of the training problems"),
    Key("data.eval_seed", 1, SEED, "generated tasks: seed of the held-out problems"),
    Key("data.reasoning_gym.weights", "", STRING,
        "reasoning_gym source: 'NAME=W,NAME=W' sampling weight of each task; '' = equal",
        read_if=GYM_SOURCE),
    Key("data.reasoning_gym.config", "{}", STRING,
        "reasoning_gym source: JSON {task: {setting: value}} passed to the task's generator "
        "(reasoning_gym.create_dataset); seed 0 and the library's size unless given",
        read_if=GYM_SOURCE),
    Key("data.reasoning_gym.template", "{question}", NONEMPTY,
        "reasoning_gym source: the prompt, a str.format template over the item's question and "
        "metadata fields, e.g. '{expression}='", read_if=GYM_SOURCE),
    Key("data.verifiers.args", "{}", STRING,
        "verifiers source: JSON object of keyword arguments for the environment's loader "
        "(load_environment or MODULE:FUNCTION)", read_if=VERIFIERS_SOURCE),
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
    Key("rollout.weight_dtype", None, optional(choice("float8_e4m3fn")),
        "low-precision sampling (docs/rollout.md): each time the learner's weights are "
        "published to the engine, the layers' projection and expert kernels are quantised per "
        "output channel to this dtype and the sampler computes with the dequantised values in "
        "its dtype (rollout.dtype): the numerics of FP8 weights, the learner keeping full "
        "precision; FP8 matmuls and their memory saving need an accelerator path not built "
        "here; None = off"),
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
        read_if=JUDGE),
    Key("reward.judge.template", "question: {prompt}\nanswer: {completion}\nscore: ",
        parsed(judge_template, "a template naming {prompt} and {completion}"),
        "the judge's prompt, a str.format template over the row's prompt and completion (as "
        "prompts are: chat template, BOS)", read_if=JUDGE),
    Key("reward.judge.parse", "number", choice("number", "p_yes"),
        "verdict -> score: number (the first match of reward.judge.pattern in the judge's "
        "generated verdict, clipped to reward.judge.range) | p_yes (P(reward.judge.yes) of the "
        "judge's next token after the template, no sampling)", read_if=JUDGE),
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
        "tokenizer (e.g. 'y' with the char tokenizer)", read_if=JUDGE & equals(
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
        "the RLHF demo's cold start (configs/rlhf.py): when > 0 and reward.model.source="
        "'run:DIR' holds no export yet, the gold scorer labels this many preference pairs of the "
        "embedded task into rm.train_file (kept if it exists) and `rljax rm` trains the reward "
        "model into DIR first (rm.*, model.*), as model.source='sft' is trained first; 0 = off",
        read_if=named_source("gold")),
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
        read_if=RM_SOURCE),
    Key("reward.model.tokenizer", "", STRING,
        "the reward model's tokenizer: '' = its own (the hf: directory's tokenizer files, the "
        "rm run's data.tokenizer) | 'char' | a local Hugging Face tokenizer directory; the "
        "policy's ids are reused when it is the policy's, else the text is re-encoded",
        read_if=RM_SOURCE),
    Key("reward.model.chat_template", False, BOOL,
        "render prompts with the reward model tokenizer's chat template", read_if=RM_SOURCE),
    Key("reward.model.batch_size", 0, integer(0),
        "rows per reward-model forward (rounded up to a multiple of the data-parallel width); "
        "0 = the whole batch in one", read_if=RM_SOURCE),
    Key("reward.model.dtype", "", choice("", *DTYPES),
        "reward-model compute dtype; '' = model.dtype (bfloat16 on accelerators)",
        read_if=RM_SOURCE),
    # --- multi-turn environment (docs/multiturn.md) -------------------------------------------
    Key("env.name", None, optional(registered("environment")),
        "None = single-turn rollouts scored by reward.fn | a registered environment: multi-turn "
        "rollouts (turns of at most rollout.max_new_tokens, tool calls, observations) scored by "
        "it"),
    Key("env.max_turns", 4, integer(1, 10**4),
        "most policy turns per episode; an episode still running after them ends unsolved",
        read_if=MULTI_TURN),
    Key("env.max_tokens", 256, SIZE,
        "token budget of a trajectory after its prompt (policy and environment tokens): the "
        "record's T; a trajectory that reaches it ends, flagged truncated", read_if=MULTI_TURN),
    Key("env.timeout_s", 5.0, POSITIVE,
        "per reset / step call in its worker process (reward.workers of them): a hard bound, the "
        "trajectory of a call past it (or crashing) ends with reward 0, counted",
        read_if=MULTI_TURN),
    Key("env.tool_format", "compact", choice("compact", "hermes"),
        "how tool calls are written: compact '<calc 12*3>' (char-level tasks) | hermes "
        "'<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>' (Qwen / Hermes; with "
        "data.chat_template a turn is a whole assistant message, answered by the chat "
        "template's tool messages)", read_if=MULTI_TURN),
    Key("env.engine", "turn_sync", registered("episode_engine"),
        "turn_sync: every turn is one sampler call over the live rows, then every step (a turn "
        "waits for its slowest row and tool) | continuous: a row whose turn ends steps its "
        "environment while the others decode, and re-enters with its KV cache kept "
        "(rljax/envs/continuous.py)", read_if=MULTI_TURN),
    Key("env.turn_discount", 1.0, FRACTION,
        "token-level estimators (gae, reinforce_pp, remax): < 1 puts each turn's reward at its "
        "last policy token, discounted per turn (a token of turn k sees sum_j>=k d^(j-k) r_j); "
        "1 = the episode's summed reward on its last token",
        read_if=MULTI_TURN & meta_says("algo.advantage", _token_level, "a token-level estimator",
                                      _one_reward_per_episode)),
    Key("env.slots", 0, integer(0, 2**31 - 1),
        "continuous engine: rows decoding at once (lanes); 0 = every row of the batch (a call "
        "narrows to S/8, S/4 or S/2 lanes when that holds the rows decoding or ready to)",
        read_if=MULTI_TURN & equals("env.engine", "continuous", lambda f, k: (
        f"only env.engine='continuous' decodes in lanes (env.engine={f['env.engine']!r})"))),
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
    Key("train.loggers", ("jsonl", "tensorboard"), LOGGER_NAMES,
        "where metrics go: jsonl (run_dir/metrics.jsonl, always on) | tensorboard | wandb | "
        "mlflow (docs/integrations.md)"),
    Key("train.tracker_project", "rljax", NONEMPTY,
        "wandb/mlflow loggers: the W&B project, the MLflow experiment", read_if=TRACKED),
    Key("train.tracker_run_name", "", STRING,
        "wandb/mlflow loggers: the run's name; '' = the run dir's name", read_if=TRACKED),
    Key("train.tracker_group", "", STRING,
        "wandb/mlflow loggers: the W&B group, the MLflow tag rljax.group ('' = none); "
        "`rljax sweep` sets it to the study's name", read_if=TRACKED),
    Key("train.tracker_tags", (), STRING_TUPLE, "wandb/mlflow loggers: the run's tags",
        read_if=TRACKED),
    Key("train.mlflow_tracking_uri", "", STRING,
        "mlflow logger: the tracking server or store; '' = MLflow's own default "
        "(MLFLOW_TRACKING_URI)", read_if=logger_on("mlflow")),
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
        "`rljax rm`: tokens of one scored row (prompt, response, EOS); a longer pair is an error "
        "naming its line"),
    Key("rm.eval_every", 0, integer(0),
        "`rljax rm`: held-out pairwise accuracy every N steps; 0 = before and after"),
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
))

KEY_BY_NAME = {key.name: key for key in KEYS}


# --- between keys --------------------------------------------------------------------------------

def _one_filled_mesh_axis(f):
  fill = [f"mesh.{axis}" for axis in MESH_AXES if f[f"mesh.{axis}"] == -1]
  if len(fill) > 1:
    return (f"only one mesh axis may be -1 (the devices the others leave), got "
            f"{', '.join(fill)}")


def _multiple(name, of, only_if=lambda f: True):
  def broken(f):
    if only_if(f) and f[name] % f[of]:
      return f"{name}={f[name]} must be a multiple of {of}={f[of]}"
  return broken


def _rows_split(f):
  rows = f["rollout.prompts_per_step"] * f["rollout.group_size"]
  if rows % (f["algo.minibatches"] * f["algo.micro_batches"]):
    return (f"rollout.prompts_per_step x rollout.group_size = {rows} rows do not split into "
            f"algo.minibatches={f['algo.minibatches']} x "
            f"algo.micro_batches={f['algo.micro_batches']} equal parts")


def _teacher(f):
  if f["algo.opd_coef"] > 0 and not f["teacher.source"]:
    return (f"algo.opd_coef={f['algo.opd_coef']!r} needs a distillation teacher: set "
            "teacher.source ('hf:PATH', 'run:DIR', 'sft' or 'tiny')")


def _lora_critic(f):
  if f["model.lora.rank"] > 0 and f["critic.enabled"]:
    return (f"model.lora.rank={f['model.lora.rank']} with critic.enabled=True: the critic is a "
            "full trainable copy of the policy's trunk and shares nothing with the frozen base; "
            "use a critic-free estimator (critic.enabled=False) or model.lora.rank=0")


def _lora_reference(f):
  if f["model.lora.rank"] > 0 and f["algo.ref_update"] == "ema" and f["algo.kl_placement"] != "none":
    return (f"model.lora.rank={f['model.lora.rank']} with algo.ref_update='ema': the reference "
            "of a LoRA policy is its frozen base (no second copy to average into); use "
            "algo.ref_update='frozen' or model.lora.rank=0")


def _selective_groups(f):
  if f["algo.selective_rollout"] and f["rollout.group_size"] == 1:
    return ("algo.selective_rollout=True with rollout.group_size=1: a group of one completion "
            "never has a reward spread, so every prompt would count as uninformative; use "
            "rollout.group_size >= 2")


def _needs_groups(f):
  """An estimator that reads ``group_size`` and declares no smaller minimum (``min_group_size``)
  has its baseline from the other completions of the prompt."""
  advantage = f["algo.advantage"]
  meta = registry_meta("advantage", advantage)
  if (f["rollout.group_size"] == 1 and "group_size" in meta["inputs"]
      and meta.get("min_group_size", 2) > 1):
    return (f"rollout.group_size=1 with algo.advantage={advantage!r}"
            + (f" (adv_std={f['algo.adv_std']!r})" if advantage == "grpo" else "")
            + ": this estimator's baseline comes from the other completions of the prompt; "
            "use rollout.group_size >= 2")


def _inflight_single_turn(f):
  chunk = f["rollout.inflight_chunk"]
  if chunk and f["env.name"] is not None:
    return (f"rollout.inflight_chunk={chunk}: multi-turn episodes (env.name={f['env.name']!r}) "
            "take new weights between steps only")
  if chunk and f["model.router_replay"] == "R3":
    return (f"rollout.inflight_chunk={chunk} with model.router_replay='R3': the sampler's "
            "experts are not joined across chunks; use 'R2' or 'off'")


def _replay_single_turn(f):
  if f["model.router_replay"] == "R3" and f["env.name"] is not None:
    return ("model.router_replay='R3' replays the experts the sampler chose for each token; "
            f"multi-turn episodes (env.name={f['env.name']!r}) do not record them: use 'R2' (the "
            "old-log-prob forward's experts) or 'off'")


def _hermes_tokenizer(f):
  if f["env.name"] is not None and f["env.tool_format"] == "hermes" \
      and f["data.tokenizer"] == "char":
    return ("env.tool_format='hermes' needs a tokenizer that can write "
            "'<tool_call>{\"name\": ...}</tool_call>'; the char tokenizer has no braces, quotes or "
            "'_': use env.tool_format='compact'")


def _overlong_buffer(f):
  if f["env.name"] is None and f["reward.overlong_buffer"] > f["rollout.max_new_tokens"]:
    return (f"reward.overlong_buffer={f['reward.overlong_buffer']} is larger than "
            f"rollout.max_new_tokens={f['rollout.max_new_tokens']}: the punishment would start "
            "before the first token; use a buffer of at most the completion budget")


def _gym_reward(f):
  if f["reward.fn"] == REASONING_GYM and not GYM_SOURCE.test(f, ""):
    return (f"reward.fn={REASONING_GYM!r} scores problems of data.source='{REASONING_GYM}:NAME' "
            f"only (it calls the generating task's scorer); data.source={f['data.source']!r}")


def _verifiers_pair(f):
  source, env = f["data.source"].startswith(VERIFIERS + ":"), f["env.name"] == VERIFIERS
  if source != env:
    return (f"data.source={f['data.source']!r} and env.name={f['env.name']!r}: a verifiers "
            f"environment's dataset (data.source='{VERIFIERS}:ID') is run by its own episodes "
            f"(env.name='{VERIFIERS}'), and that environment needs those prompts; set both")


def _normalized_sources(f):
  names = composed_sources(f)
  for key, parse in (("reward.normalize", reward_normalize), ("reward.clip", reward_clip)):
    stray = [n for n in parse(f[key]) if n not in names]
    if stray:
      return (f"{key}={f[key]!r} names {stray[0]!r}, which is not a source of the reward "
              f"(reward.sources={f['reward.sources']!r}: {', '.join(names)})")


def _task_source_fits(f):
  names, own = composed_sources(f), task_source(f)
  other = ENV_SOURCE if own == VERIFIER_SOURCE else VERIFIER_SOURCE
  if other in names:
    why = (f"single-turn rollouts (env.name=None) are scored by '{VERIFIER_SOURCE}'"
           if own == VERIFIER_SOURCE else
           f"multi-turn episodes (env.name={f['env.name']!r}) are scored by '{ENV_SOURCE}'")
    return f"reward.sources={f['reward.sources']!r} names '{other}': {why}"


def _turn_rewards_alone(f):
  """Per-turn token rewards (turn_discount < 1) carry the environment's reward only."""
  if f["env.name"] is None or f["env.turn_discount"] >= 1.0:
    return None
  names = composed_sources(f)
  added = [n for n, w in names.items() if w and n != ENV_SOURCE]
  if names.get(ENV_SOURCE) != 1.0 or added or ENV_SOURCE in reward_normalize(
      f["reward.normalize"]) or ENV_SOURCE in reward_clip(f["reward.clip"]):
    return (f"env.turn_discount={f['env.turn_discount']} places the environment's own turn "
            f"rewards on tokens; reward.sources={f['reward.sources']!r} (with reward.normalize/"
            "clip) changes the episode's reward: use 'env:1.0' unnormalised (other sources with "
            "weight 0, logged only) or env.turn_discount=1")


def _sampler_old_logp(f):
  """``algo.old_logp='sampler'`` leaves out the scoring forward, so nothing may need it: the
  80/20 mask's ``H_old``, R2's replayed experts; rollout correction sampler -> old would weigh
  every token by ``exp(0) = 1``."""
  if f["algo.old_logp"] != "sampler":
    return None
  why = "algo.old_logp='sampler' runs no scoring forward"
  if f["algo.entropy_top_rho"] < 1.0:
    return (f"algo.entropy_top_rho={f['algo.entropy_top_rho']!r} masks by H_old of the scoring "
            f"forward; {why}: use algo.old_logp='recompute'")
  if f["model.router_replay"] == "R2":
    return (f"model.router_replay='R2' replays the experts of the old-log-prob forward; {why}: "
            "use 'R3' (the sampler's experts) or 'off'")
  correcting = [f"{k}={f[k]!r}" for k, off in CORRECTION_OFF.items() if f[k] != off]
  if correcting:
    return (f"{correcting[0]}: rollout correction weighs sampler -> old log-probs, and with "
            "algo.old_logp='sampler' they are the same (every ratio 1); drop it, or use "
            "algo.old_logp='recompute'")


# The rollout-correction keys and their 'off' values (rljax.transforms.correction).
CORRECTION_OFF = {"algo.tis_cap": None, "algo.rollout_is": "none", "algo.rollout_rs": "none",
                  "algo.rollout_rs_veto": None, "algo.rollout_rs_k3": None}


def _reward_model_named(f):
  if RM_SOURCE.test(f, "") and not f["reward.model.source"]:
    return (f"reward.sources={f['reward.sources']!r} names '{REWARD_MODEL_SOURCE}': set "
            "reward.model.source ('hf:PATH' of a sequence classifier or 'run:DIR' of an "
            "`rljax rm` run)")


def _env_workers(f):
  if f["env.name"] is not None and f["reward.workers"] == 0:
    return (f"reward.workers=0 with env.name={f['env.name']!r}: the environment's steps run in "
            "worker processes (under env.timeout_s); set reward.workers >= 1")


RELATIONS = (
    Relation(("reward.normalize", "reward.clip", "reward.sources"),
             "per-source normalisation names sources of the reward", _normalized_sources),
    Relation(("reward.sources", "env.name"),
             "'verifier' scores single-turn rollouts, 'env' multi-turn episodes",
             _task_source_fits),
    Relation(("reward.workers", "env.name"), "an environment steps in worker processes",
             _env_workers),
    Relation(("reward.sources", "env.turn_discount"),
             "per-turn token rewards: the environment's reward alone", _turn_rewards_alone),
    Relation(tuple(f"mesh.{axis}" for axis in MESH_AXES), "at most one axis is -1",
             _one_filled_mesh_axis),
    Relation(("model.hidden_size", "model.num_heads"), "heads divide the width ('tiny'/'sft')",
             _multiple("model.hidden_size", "model.num_heads", lambda f: FRESH_MODEL.test(f, ""))),
    Relation(("model.num_heads", "model.num_kv_heads"),
             "key/value heads divide the query heads ('tiny'/'sft')",
             _multiple("model.num_heads", "model.num_kv_heads", lambda f: FRESH_MODEL.test(f, ""))),
    Relation(("rollout.prompts_per_step", "rollout.group_size", "algo.minibatches",
              "algo.micro_batches"), "the P x G rows of a step split into minibatches x "
             "micro_batches equal parts", _rows_split),
    Relation(("algo.opd_coef", "teacher.source"), "distillation (opd_coef > 0) needs a teacher",
             _teacher),
    Relation(("rollout.group_size", "algo.advantage"),
             "G >= 2 for an estimator whose baseline is the group", _needs_groups),
    Relation(("algo.selective_rollout", "rollout.group_size"),
             "selective rollouts judge a prompt by its group's spread: G >= 2", _selective_groups),
    Relation(("rollout.inflight_chunk", "env.name", "model.router_replay"),
             "in-flight updates: single-turn rollouts, router replay not R3",
             _inflight_single_turn),
    Relation(("model.router_replay", "env.name"), "R3 replay: single-turn rollouts",
             _replay_single_turn),
    Relation(("env.tool_format", "data.tokenizer"), "hermes tool calls need a real tokenizer",
             _hermes_tokenizer),
    Relation(("reward.overlong_buffer", "rollout.max_new_tokens"),
             "DAPO's overlong buffer is at most the completion budget", _overlong_buffer),
    Relation(("reward.fn", "data.source"), "the reasoning_gym scorer needs its source",
             _gym_reward),
    Relation(("data.source", "env.name"), "a verifiers source and the verifiers environment go "
             "together", _verifiers_pair),
    Relation(("reward.sources", "reward.model.source"),
             f"the reward model source '{REWARD_MODEL_SOURCE}' needs reward.model.source",
             _reward_model_named),
    Relation(("model.lora.rank", "critic.enabled"),
             "LoRA: no critic (it would be a full copy sharing nothing with the base)",
             _lora_critic),
    Relation(("model.lora.rank", "algo.ref_update", "algo.kl_placement"),
             "LoRA: the reference is the frozen base (algo.ref_update='frozen')", _lora_reference),
    Relation(("algo.old_logp", "algo.entropy_top_rho", "model.router_replay", *CORRECTION_OFF),
             "algo.old_logp='sampler': no 80/20 mask, R2 replay or rollout correction (each "
             "needs the scoring forward or compares the sampler with itself)", _sampler_old_logp),
)


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
