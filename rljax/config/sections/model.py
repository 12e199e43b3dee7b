"""The ``model.*`` keys: the policy's source, a fresh model's architecture, numerics, memory
layout, LoRA adapters.

Declared in the format ``rljax/config/table.py`` describes; the table concatenates the sections
in the order of docs/config.md."""
from __future__ import annotations

from rljax.config.declare import (BOOL, LAYOUT, NONEMPTY, POSITIVE, SIZE, Check, Key, choice,
                                  equals, integer, optional, reads, registered)
from rljax.config.conditions import (FRESH_MODEL, LORA, MOE_MODEL, NO_LORA, SIZED_TOWER,
                                     VISION_MODEL)
from rljax.config.sections.common import ALL_COMMANDS, DTYPES, RL_RM

REMAT_MODES = ("none", "full", "dots")  # model.remat; True/False of old configs: full/none
MODEL_DIM = integer(1, 2**20)  # a model dimension; larger ones overflow int32 shapes, never fit
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


KEYS = (
    # --- model ---------------------------------------------------------------------------------
    Key("model.source", "tiny", NONEMPTY,
        "'tiny' (random, the sizes below) | 'hf:PATH' (a Hugging Face directory) | 'sft' (the "
        "supervised cold start of section sft, trained first if not on disk) | 'run:DIR[@STEP]' "
        "(the policy of another run's latest checkpoint, or of step STEP)", commands=ALL_COMMANDS),
    Key("model.hidden_size", 128, MODEL_DIM, "width of the 'tiny'/'sft' model",
        read_if=FRESH_MODEL, commands=ALL_COMMANDS),
    Key("model.intermediate_size", 384, MODEL_DIM, "MLP width of the 'tiny'/'sft' model",
        read_if=FRESH_MODEL, commands=ALL_COMMANDS),
    Key("model.num_layers", 4, MODEL_DIM, "layers of the 'tiny'/'sft' model", read_if=FRESH_MODEL,
        commands=ALL_COMMANDS),
    Key("model.num_heads", 4, MODEL_DIM, "query heads of the 'tiny'/'sft' model",
        read_if=FRESH_MODEL, commands=ALL_COMMANDS),
    Key("model.num_kv_heads", 2, MODEL_DIM, "key/value heads of the 'tiny'/'sft' model (GQA)",
        read_if=FRESH_MODEL, commands=ALL_COMMANDS),
    Key("model.rope_theta", 10000.0, POSITIVE, "RoPE base of the 'tiny'/'sft' model",
        read_if=FRESH_MODEL, commands=ALL_COMMANDS),
    Key("model.tie_embeddings", True, BOOL, "'tiny'/'sft' model: LM head = embedding matrix",
        read_if=FRESH_MODEL, commands=ALL_COMMANDS),
    Key("model.family", "llama", registered("model_family"),
        "'tiny'/'sft' model: its family, an HF model_type (`rljax.models.families`)",
        read_if=FRESH_MODEL, commands=ALL_COMMANDS),
    Key("model.num_experts", 4, MODEL_DIM,
        "'tiny'/'sft' model of an MoE family: experts of each (sparse) layer",
        read_if=FRESH_MODEL & MOE_MODEL, commands=ALL_COMMANDS),
    Key("model.experts_per_token", 2, MODEL_DIM,
        "'tiny'/'sft' model of an MoE family: experts each token is routed to (top-k)",
        read_if=FRESH_MODEL & MOE_MODEL, commands=ALL_COMMANDS),
    Key("model.moe_intermediate_size", 96, MODEL_DIM,
        "'tiny'/'sft' model of an MoE family: MLP width of one expert",
        read_if=FRESH_MODEL & MOE_MODEL, commands=ALL_COMMANDS),
    Key("model.vision.depth", 2, MODEL_DIM,
        "'tiny'/'sft' model of a vision-language family: blocks of its vision tower (the last "
        "attends over the whole image, the others within windows)",
        read_if=FRESH_MODEL & SIZED_TOWER, commands=ALL_COMMANDS),
    Key("model.vision.hidden_size", 32, MODEL_DIM,
        "'tiny'/'sft' model of a vision-language family: width of its vision tower",
        read_if=FRESH_MODEL & SIZED_TOWER, commands=ALL_COMMANDS),
    Key("model.vision.intermediate_size", 64, MODEL_DIM,
        "'tiny'/'sft' model of a vision-language family: MLP width of its vision tower",
        read_if=FRESH_MODEL & SIZED_TOWER, commands=ALL_COMMANDS),
    Key("model.vision.num_heads", 2, MODEL_DIM,
        "'tiny'/'sft' model of a vision-language family: attention heads of its vision tower",
        read_if=FRESH_MODEL & SIZED_TOWER, commands=ALL_COMMANDS),
    Key("model.vision.patch_size", 14, MODEL_DIM,
        "'tiny'/'sft' model of a vision-language family: pixels per patch side; 2x2 patches "
        "make one image token, so an H x W image is H W / (2 patch)^2 tokens (H, W multiples "
        "of 2 patch)", read_if=FRESH_MODEL & SIZED_TOWER, commands=ALL_COMMANDS),
    Key("model.moe_dispatch", "sparse", choice("dense", "sparse", "capacity"),
        "MoE layers in the trainer: sparse (dropless: tokens sorted by expert, grouped matmuls) "
        "| dense (the reference: every expert sees every token) | capacity (GShard dispatch, "
        "tokens past an expert's capacity dropped and counted in moe/dropped)", read_if=MOE_MODEL,
        commands=ALL_COMMANDS),
    Key("model.moe_capacity_factor", 1.25, POSITIVE,
        "MoE capacity dispatch: slots per expert = factor x tokens x k / experts",
        read_if=MOE_MODEL & equals("model.moe_dispatch", "capacity"), commands=ALL_COMMANDS),
    Key("model.router_replay", "off", choice("off", "R2", "R3"),
        "MoE routing in the trainer: off (its own) | R2 (the old-log-prob forward's experts, "
        "replayed in the update) | R3 (the sampler's experts, replayed in every policy forward)",
        read_if=MOE_MODEL, commands=ALL_COMMANDS),
    Key("model.dtype", "auto", choice("auto", *DTYPES),
        "compute dtype; auto = bfloat16 on GPUs/TPUs (params stay model.param_dtype), float32 "
        "on CPU", commands=ALL_COMMANDS),
    Key("model.param_dtype", "float32", choice(*DTYPES), "parameter (master weight) dtype",
        commands=ALL_COMMANDS),
    Key("model.remat", "none",
        choice(*REMAT_MODES, True, False, "True", "False", "true", "false"),
        "per-layer rematerialisation: none | full (keep each layer's input) | dots (also the "
        "weight matmuls' outputs); True/False read as full/none",
        commands=ALL_COMMANDS, effect=LAYOUT),
    Key("model.scan_layers", False, BOOL,
        "training/scoring forward as a lax.scan over the layers (same parameter tree); remat "
        "saves memory on XLA:CPU only with it", commands=ALL_COMMANDS, effect=LAYOUT),
    Key("model.attention", "auto", choice("auto", "xla", "blockwise", "cudnn", "pallas"),
        "attention kernel: auto (cudnn on GPUs, float32 compute in bf16 inputs; pallas on TPUs; "
        "else blockwise) | xla (materialised scores, the reference) | blockwise | cudnn | "
        "pallas", commands=ALL_COMMANDS),
    Key("model.attention_block", 128, SIZE, "max query/key block of the blockwise attention",
        commands=ALL_COMMANDS),
    Key("model.matmul_precision", "default", choice("default", "high", "highest"),
        "float32 matmul precision: default (TF32 on GPUs, bf16 passes on TPUs) | high | highest "
        "(float32 parity with transformers on an accelerator)", commands=ALL_COMMANDS),
    Key("model.logits_chunk", 512, SIZE,
        "sequence chunk of the log-prob/entropy head (never [B, T, V] at once)",
        commands=ALL_COMMANDS, effect=LAYOUT),
    Key("model.forward_tokens", -1, integer(-1, 2**31 - 1),
        "most tokens per data shard in one forward/backward of scoring and the update (rows "
        "go in chunks, exact accumulation); -1 = auto (1024 per CPU thread of a device, no "
        "limit on accelerators), 0 = no limit", commands=ALL_COMMANDS, effect=LAYOUT),
    Key("model.pack", "auto", choice("auto", "True", "False", "true", "false"),
        "scoring and update forwards take the sequences packed (first-fit decreasing) into "
        "rows as wide as the padded ones, model.forward_tokens per data shard a chunk; outputs "
        "go back to the padded layout, so every loss is the padded one's; auto = packed on "
        f"{'/'.join(AUTO_PACK_PLATFORMS)} where a forward's packed layout has at least "
        f"{AUTO_PACK_MIN_CHUNKS} chunks (the empty ones are skipped), else padded; True / False "
        "force it. A model whose MoE layers dispatch by capacity is never packed (True is "
        "refused: that dispatch depends on the tokens sharing a forward)",
        commands=ALL_COMMANDS, effect=LAYOUT),
    Key("model.parallel_chunks", -1, integer(1, 1024, also=(-1,)),
        "row chunks (model.forward_tokens) computed side by side per scan iteration: "
        "independent, so XLA:CPU runs them on separate threads; -1 = auto (one per CPU thread "
        "of a device, 1 on accelerators)", commands=ALL_COMMANDS, effect=LAYOUT),
    Key("model.vision.trainable", True, BOOL,
        "the policy's updates (RL and the SFT cold start) train the vision tower (its blocks "
        "and patch merger); False keeps it as loaded: no gradient, no optimizer state (a "
        "critic, a copy of the policy's trunk, trains its own tower's copy either way)",
        read_if=VISION_MODEL & NO_LORA, commands=reads("train", "plan", "sft")),
    Key("model.lora.rank", 0, integer(0, 2**16),
        "rank r of low-rank adapters (LoRA) on the projections model.lora.targets; the rest of "
        "the model is the frozen base, which is also the KL reference; 0 = full fine-tuning",
        commands=RL_RM),  # `rljax rm` reads it to refuse adapters (it trains every weight)
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
)
