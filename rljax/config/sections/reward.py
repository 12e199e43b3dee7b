"""The ``reward.*`` keys (verifiers, reward sources and their composition, the LLM judge, the
RLHF demo's gold scorer, a reward model as a reward) and the ``env.*`` keys (multi-turn
environments and agent harnesses).

Declared in the format ``rljax/config/table.py`` describes; the table concatenates the sections
in the order of docs/config.md."""
from __future__ import annotations

from rljax.config.declare import (BOOKKEEPING, BOOL, FRACTION, LAYOUT, NONEMPTY, NONNEG, POSITIVE,
                                  SIZE, STRING, Check, Key, choice, equals, integer, meta_says,
                                  optional, parsed, real, registered)
from rljax.config.conditions import (DRIVER_READS, JUDGE_NUMBER, MULTI_TURN, OVERLONG_SHAPING,
                                     REWARD_SOURCE_READS, SINGLE_TURN, VERIFIER_PROCESSES,
                                     _one_reward_per_episode, _token_level)
from rljax.config.reward_spec import (judge_pattern, judge_template, reward_clip, reward_normalize,
                                      reward_weights)
from rljax.config.sections.common import DTYPES, RL_SFT

KEYS = (
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
        read_if=SINGLE_TURN & VERIFIER_PROCESSES, effect=LAYOUT),
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
        "round trip per call, no timeout: for fast verifiers one trusts, e.g. exact_match)",
        effect=LAYOUT),
    Key("reward.max_logged_failures", 100, integer(0),
        "failed calls sampled into run_dir/reward_failures.jsonl (a multi-turn run's failed "
        "episodes: run_dir/env_failures.jsonl)", effect=BOOKKEEPING),
    Key("reward.max_worker_memory_mb", 2048, integer(0),
        "address space a verifier worker may add to what it inherited (MB; RLIMIT_AS); 0 = no "
        "limit", read_if=VERIFIER_PROCESSES, effect=LAYOUT),
    Key("reward.worker_max_calls", 0, integer(0),
        "replace a verifier worker after this many calls (a leak's bound); 0 = never",
        read_if=VERIFIER_PROCESSES, effect=LAYOUT),
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
        "through an OpenAI-compatible endpoint (docs/agents.md)", commands=RL_SFT),
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
        "template's tool messages)", read_if=MULTI_TURN, commands=RL_SFT),
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
)
