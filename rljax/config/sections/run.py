"""The run's keys: its ``seed``, the training loop and run directory (``train.*``), the supervised
cold start (``sft.*``), reward-model training (``rm.*``), the device mesh (``mesh.*``) and
multi-process start-up (``dist.*``).

Declared in the format ``rljax/config/table.py`` describes; the table concatenates the sections
in the order of docs/config.md."""
from __future__ import annotations

from rljax.config.declare import (BOOKKEEPING, BOOL, EXTENT, KEY_TUPLE, LAYOUT, MEASURE, NONEMPTY,
                                  POSITIVE, SEED, SIZE, STRING, Key, choice, equals, integer,
                                  optional, reads, real, registered_tuple)
from rljax.config.conditions import GOLD_COLD_START, LOGGER_READS, SFT_MODEL, SFT_STOP
from rljax.config.sections.common import ALL_COMMANDS, RL_RM, STRING_TUPLE

MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")  # the mesh's axes, in device order
MESH_AXIS = integer(1, also=(-1,))  # any one axis may be -1: the devices the others leave
# `rljax sft` reads the cold start's keys; the other commands where a model of their run is it.
SFT_READERS = reads("sft", train=SFT_MODEL, eval=SFT_MODEL, plan=SFT_MODEL, rm=SFT_MODEL)
# `rljax rm` reads the reward model's training keys; the RL run where it trains one first.
RM_READERS = reads("rm", train=GOLD_COLD_START, eval=GOLD_COLD_START, plan=GOLD_COLD_START)

SEED_KEY = (
    Key("seed", 0, SEED, "the run's seed: model init (not the SFT cold start's: sft.seed), "
        "sampling, shuffling, Clip-Cov draws", commands=RL_RM),
)

KEYS = (
    # --- training loop -------------------------------------------------------------------------
    Key("train.steps", 100, integer(1, 10**9), "RL steps", effect=EXTENT),
    Key("train.eval_every", 0, integer(0), "held-out eval every N steps; 0 = before and after",
        effect=MEASURE),
    Key("train.checkpoint_every", 0, integer(0), "checkpoint every N steps; 0 = at the end",
        effect=BOOKKEEPING, commands=RL_RM),
    Key("train.keep_checkpoints", 3, integer(1), "checkpoints kept",
        effect=BOOKKEEPING, commands=RL_RM),
    Key("train.run_dir", "runs/default", NONEMPTY, "where metrics, checkpoints and exports go",
        effect=BOOKKEEPING, commands=RL_RM),
    Key("train.resume", False, BOOL, "continue the run in run_dir",
        effect=BOOKKEEPING, commands=RL_RM),
    Key("train.resume_override", (), KEY_TUPLE,
        "keys allowed to differ from the run being resumed, e.g. ('optim.lr',); steps may grow",
        effect=BOOKKEEPING, commands=RL_RM),
    Key("train.progress", True, BOOL, "live progress bar", effect=BOOKKEEPING, commands=RL_RM),
    Key("train.export_hf", True, BOOL, "export the final policy in Hugging Face format",
        effect=BOOKKEEPING),
    Key("train.compilation_cache", True, BOOL,
        "keep compiled XLA programs in run_dir/xla_cache (in JAX_COMPILATION_CACHE_DIR instead "
        "where that is set), so a restarted or resumed run loads them instead of compiling again",
        effect=LAYOUT),
    Key("train.loggers", ("jsonl", "tensorboard"), registered_tuple("logger", required=("jsonl",)),
        "where metrics go: jsonl (run_dir/metrics.jsonl, always on) | tensorboard | wandb | "
        "mlflow (docs/integrations.md)", effect=BOOKKEEPING, commands=RL_RM),
    Key("train.tracker_project", "rljax", NONEMPTY,
        "wandb/mlflow loggers: the W&B project, the MLflow experiment", read_if=LOGGER_READS,
        effect=BOOKKEEPING, commands=RL_RM),
    Key("train.tracker_run_name", "", STRING,
        "wandb/mlflow loggers: the run's name; '' = the run dir's name", read_if=LOGGER_READS,
        effect=BOOKKEEPING, commands=RL_RM),
    Key("train.tracker_group", "", STRING,
        "wandb/mlflow loggers: the W&B group, the MLflow tag rljax.group ('' = none); "
        "`rljax sweep` sets it to the study's name", read_if=LOGGER_READS,
        effect=BOOKKEEPING, commands=RL_RM),
    Key("train.tracker_tags", (), STRING_TUPLE, "wandb/mlflow loggers: the run's tags",
        read_if=LOGGER_READS, effect=BOOKKEEPING, commands=RL_RM),
    Key("train.mlflow_tracking_uri", "", STRING,
        "mlflow logger: the tracking server or store; '' = MLflow's own default "
        "(MLFLOW_TRACKING_URI)", read_if=LOGGER_READS, effect=BOOKKEEPING, commands=RL_RM),
    Key("train.max_skipped_steps", 10, integer(0),
        "stop after this many consecutive steps whose every update was skipped as non-finite; "
        "0 = never"),
    Key("train.preempt_grace_s", 30.0, POSITIVE,
        "after SIGTERM: seconds for the step in flight and the checkpoint save before exiting",
        effect=BOOKKEEPING, commands=ALL_COMMANDS),
    # --- supervised cold start (model.source='sft') --------------------------------------------
    Key("sft.steps", 600, integer(1, 10**9), "SFT steps", commands=SFT_READERS),
    Key("sft.batch_size", 64, SIZE, "SFT batch", commands=SFT_READERS),
    Key("sft.lr", 3e-3, POSITIVE, "SFT learning rate", commands=SFT_READERS),
    Key("sft.warmup_steps", 50, integer(0), "SFT warmup steps", commands=SFT_READERS),
    Key("sft.seed", 1234, SEED, "the cold start's init and its stream of SFT examples (of the "
        "train split); not the run's seed, so every seed of a study starts from one cold start",
        commands=SFT_READERS),
    Key("sft.stop_match", 0.0, real(0.0, 1.0),
        "stop SFT at the first check where held-aside train problems reach this share on "
        "sft.stop_on's measure (greedy: solved exactly by greedy decoding, teacher-forced argmax "
        "= the reference at every learned token); 0 = train all sft.steps. Gives every sft.seed "
        "a cold start of the same skill",
        commands=SFT_READERS),
    Key("sft.stop_on", "greedy", choice("greedy", "sampled"),
        "what sft.stop_match measures: greedy = the share solved exactly by greedy decoding; "
        "sampled = the mean probability that sampling at temperature 1 writes the reference "
        "(teacher-forced, observations given): the share of a fresh RL run's samples that "
        "reproduce it, counting every strategy of the references (a tool call in some, a direct "
        "answer in others) at the rate the policy samples it",
        read_if=SFT_STOP, commands=SFT_READERS),
    Key("sft.check_every", 10, integer(1), "SFT steps between exact-match checks",
        read_if=SFT_STOP, commands=SFT_READERS),
    Key("sft.check_size", 256, SIZE, "problems of the exact-match check (their own stream of "
        "the train split, never the eval split)",
        read_if=SFT_STOP, commands=SFT_READERS),
    Key("sft.out_dir", "runs/sft", NONEMPTY,
        "reused when it holds the cold start of the same sft/model/data keys; one of "
        "other keys is kept, and this run's goes beside it in <sft.out_dir>-<hash of the keys>",
        effect=BOOKKEEPING, commands=SFT_READERS),
    # --- reward-model training (`rljax rm`, docs/reward_models.md) -----------------------------
    Key("rm.train_file", "", STRING,
        "`rljax rm`: JSONL preference pairs, one {\"prompt\", \"chosen\", \"rejected\"} per line",
        commands=RM_READERS),
    Key("rm.eval_file", "", STRING,
        "`rljax rm`: held-out pairs for the pairwise accuracy; '' = rm.eval_fraction of "
        "rm.train_file", commands=RM_READERS),
    Key("rm.eval_fraction", 0.1, real(0.0, 1.0),
        "`rljax rm`: share of rm.train_file held out (at least one pair)",
        read_if=equals("rm.eval_file", "", "rm.eval_file names the held-out pairs"),
        commands=RM_READERS),
    Key("rm.steps", 200, integer(1, 10**9), "`rljax rm`: optimizer steps (lr etc.: optim.*)",
        effect=EXTENT, commands=RM_READERS),
    Key("rm.batch_size", 16, SIZE, "`rljax rm`: preference pairs per step", commands=RM_READERS),
    Key("rm.max_tokens", 256, SIZE,
        "`rljax rm`: the longest scored row (prompt, response, EOS), bound by the model's "
        "context; a longer pair is an error naming its line. Batches are padded to their own "
        "longest row", commands=RM_READERS),
    Key("rm.eval_every", 0, integer(0),
        "`rljax rm`: held-out pairwise accuracy every N steps; 0 = before and after",
        effect=MEASURE, commands=RM_READERS),
    # --- device mesh ---------------------------------------------------------------------------
    Key("mesh.data", -1, MESH_AXIS, "data-parallel axis; -1 = the devices the others leave",
        effect=LAYOUT, commands=RL_RM),
    Key("mesh.fsdp", 1, MESH_AXIS, "fully sharded data-parallel axis",
        effect=LAYOUT, commands=RL_RM),
    Key("mesh.expert", 1, MESH_AXIS,
        "expert-parallel axis: MoE expert weights split by expert; batch rows split over it too, "
        "other weights replicated", effect=LAYOUT, commands=RL_RM),
    Key("mesh.context", 1, MESH_AXIS,
        "context-parallel axis: every sequence of the update, the scoring and the rollout (its "
        "KV cache) split over it, attention by a striped ring (docs/scale_out.md); weights split "
        "over it as over fsdp", effect=LAYOUT, commands=RL_RM),
    Key("mesh.tensor", 1, MESH_AXIS, "tensor-parallel axis", effect=LAYOUT, commands=RL_RM),
    Key("mesh.cpu_devices", -1, integer(0, 4096, also=(-1,)),
        "CPU devices `rljax train` splits the machine into before JAX starts (XLA:CPU runs one "
        "device on about one core; the mesh's data axis takes them); -1 = auto: one per core, "
        "as many as a step's rows split over; 0 = JAX's default (one)", effect=LAYOUT),
    Key("mesh.sampler_devices", 0, integer(0),
        "devices of the sampler's own (data-parallel) mesh, the last ones; the weights are "
        "copied to it after every update (docs/async.md); 0 = colocated on the learner's mesh",
        effect=LAYOUT, commands=RL_RM),
    Key("mesh.learner_devices", 0, integer(0),
        "with mesh.sampler_devices: devices of the learner's mesh (the first ones; the axes "
        "above lay them out); 0 = all the sampler leaves", effect=LAYOUT, commands=RL_RM),
    # --- multi-process start-up (rljax.parallel.distributed) -----------------------------------
    Key("dist.mode", "auto", choice("auto", "off"),
        "auto: jax.distributed.initialize() when the environment names a cluster; off",
        effect=LAYOUT, commands=RL_RM),
    Key("dist.coordinator_address", "", STRING, "host:port of process 0",
        effect=LAYOUT, commands=RL_RM),
    Key("dist.num_processes", None, optional(integer(1)), "processes; None = from the cluster",
        effect=LAYOUT, commands=RL_RM),
    Key("dist.process_id", None, optional(integer(0)), "this process; None = from the cluster",
        effect=LAYOUT, commands=RL_RM),
)
