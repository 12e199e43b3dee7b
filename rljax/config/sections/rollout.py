"""The ``rollout.*`` keys: batch shape, sampling, the rollout engine, asynchronous RL.

Declared in the format ``rljax/config/table.py`` describes; the table concatenates the sections
in the order of docs/config.md."""
from __future__ import annotations

from rljax.config.declare import (POSITIVE, SIZE, Key, When, above, choice, differs, equals,
                                  integer, optional, real, registered)
from rljax.config.conditions import ENGINE_READS
from rljax.config.sections.common import DTYPES, RL_SFT

KEYS = (
    # --- rollout -------------------------------------------------------------------------------
    Key("rollout.prompts_per_step", 8, SIZE, "P: prompts per RL step"),
    Key("rollout.group_size", 8, SIZE, "G: completions per prompt"),
    Key("rollout.max_new_tokens", 64, SIZE, "T: completion budget in tokens", commands=RL_SFT),
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
)
