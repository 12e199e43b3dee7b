"""``rljax.loading``: every role reads every form of the one source grammar (tiny, sft, hf:PATH,
run:DIR, run:DIR@STEP) the same way, against the weights the files were written with; a role
given a run of the other kind, or a model of another tokenizer, is one line."""
import os

import jax
import numpy as np
import pytest

from rljax.errors import RunDirError, TokenizerError
from rljax.loading import loader
from rljax.loading.roles import ROLES
from rljax.models import transformer
from tests.loading import runs

LM_ROLES = ("policy", "reference", "teacher", "judge", "load")
SCORE_ROLES = ("reward_model", "rm_start")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("sources")
  lm, lm_params = runs.lm_dir(str(root / "lm"))
  score, score_params = runs.score_dir(str(root / "score"))
  policy = str(root / "policy_run")
  rm = str(root / "rm_run")
  return {"lm": (lm, lm_params), "score": (score, score_params),
          "policy_run": (policy, runs.policy_run(policy)),
          "rm_run": (rm, runs.rm_run(rm, steps=(1, 2)))}


def _source(files, role: str, kind: str):
  """(source text, sft.out_dir, the parameters it must load; None: random)."""
  score = role in SCORE_ROLES
  hf, hf_params = files["score" if score else "lm"]
  run, saved = files["rm_run" if score else "policy_run"]
  return {"tiny": ("tiny", hf, None), "sft": ("sft", hf, hf_params),
          "hf": (f"hf:{hf}", hf, hf_params), "run": (f"run:{run}", hf, saved[2]),
          "run@1": (f"run:{run}@1", hf, saved[1])}[kind]


def test_every_role_is_one_entry():
  assert set(ROLES) == set(LM_ROLES) | set(SCORE_ROLES)
  assert {ROLES[r].head for r in SCORE_ROLES} == {"score"}


@pytest.mark.parametrize("kind", ["tiny", "sft", "hf", "run", "run@1"])
@pytest.mark.parametrize("role", LM_ROLES + SCORE_ROLES)
def test_every_role_reads_every_source_kind(files, role, kind):
  text, out_dir, want = _source(files, role, kind)
  r = ROLES[role]
  extra = {"sft.out_dir": out_dir}
  if r.tokenizer_key:  # the test directories hold no tokenizer files
    extra[r.tokenizer_key] = "char"
  if r.key:
    extra[r.key] = text
  config = runs.config(extra)
  policy_cfg = loader.architecture(runs.config(), "policy", runs.TOKENIZER)
  loaded = loader.load(config, role, runs.TOKENIZER, policy_cfg=policy_cfg,
                       text=None if r.key else text)
  assert loaded.source.text == text
  heads = {k for k in loaded.params if k in ("lm_head", "score")}
  assert heads <= {"score" if r.head == "score" else "lm_head"}
  assert loaded.cfg.dtype == "float32" and not (loaded.cfg.lora_rank and not r.adapters)
  shapes = transformer.param_shapes(loaded.cfg, r.head)
  assert jax.tree.map(lambda x: tuple(x.shape), shapes) == \
      jax.tree.map(lambda x: tuple(np.shape(x)), loaded.params)
  if want is not None:  # the very weights the files were written with
    assert runs.same(loaded.params, want)
  if r.tokenizer == "own":
    assert loaded.tokenizer.vocab_size == runs.TOKENIZER.vocab_size


def test_the_architecture_alone_matches_the_loaded_one(files):
  run, _ = files["policy_run"]
  for text in ("tiny", f"hf:{files['lm'][0]}", f"run:{run}", f"run:{run}@1"):
    config = runs.config({"model.source": text})
    assert loader.architecture(config, "policy", runs.TOKENIZER) == \
        loader.load(config, "policy", runs.TOKENIZER).cfg, text


@pytest.mark.parametrize("role", ["policy", "teacher", "judge"])
def test_a_policy_role_given_a_reward_model_run_is_one_line(files, role):
  rm, _ = files["rm_run"]
  config = runs.config({ROLES[role].key: f"run:{rm}"})
  with pytest.raises(RunDirError, match=r"is an `rljax rm` run \(a reward model, no language "
                                        r"model head\)") as e:
    loader.load(config, role, runs.TOKENIZER)
  assert "\n" not in str(e.value)
  with pytest.raises(RunDirError, match="is an `rljax rm` run"):
    loader.check_files(config, role, runs.TOKENIZER)


def test_a_reward_model_given_a_policy_run_is_one_line(files):
  run, _ = files["policy_run"]
  config = runs.config({"reward.model.source": f"run:{run}", "reward.model.tokenizer": "char"})
  with pytest.raises(RunDirError, match="is a policy run, not an `rljax rm` run"):
    loader.load(config, "reward_model", runs.TOKENIZER)


def test_one_tokenizer_check_for_every_role_that_reads_the_runs_ids(files):
  """The teacher's logits are compared position by position: its vocabulary must be the
  policy's exactly; the judge's may be larger, never smaller, and its EOS / padding the same."""
  lm, _ = files["lm"]
  policy_cfg = loader.architecture(runs.config(), "policy", runs.TOKENIZER)
  wider = policy_cfg.replace(vocab_size=policy_cfg.vocab_size + 7)
  for role in ("teacher", "judge"):
    config = runs.config({ROLES[role].key: f"hf:{lm}"})
    match = "teacher.source=.* has another tokenizer than the run's \\(vocab 57 / eos"
    if role == "teacher":
      with pytest.raises(TokenizerError, match=match):
        loader.load(config, role, runs.TOKENIZER, policy_cfg=wider)
    else:
      loader.load(config, role, runs.TOKENIZER, policy_cfg=policy_cfg)
    other_eos = policy_cfg.replace(eos_token_id=policy_cfg.eos_token_id + 1)
    with pytest.raises(TokenizerError, match=f"{ROLES[role].key}=.*another tokenizer"):
      loader.load(config, role, runs.TOKENIZER, policy_cfg=other_eos)
  run, _ = files["policy_run"]
  config = runs.config({"model.source": f"run:{run}", "data.chat_template": "true"})
  with pytest.raises(RunDirError, match="the run was trained with data.chat_template=False"):
    loader.load(config, "policy", runs.TOKENIZER)


def test_the_one_dtype_rule(files):
  lm, _ = files["lm"]
  config = runs.config({"teacher.source": f"hf:{lm}", "teacher.dtype": "bfloat16",
                        "model.param_dtype": "bfloat16"})
  teacher = loader.load(config, "teacher", runs.TOKENIZER)
  judge = loader.load(runs.config({"reward.judge.source": f"hf:{lm}",
                                   "model.param_dtype": "bfloat16"}), "judge", runs.TOKENIZER)
  assert (teacher.cfg.dtype, judge.cfg.dtype) == ("bfloat16", "float32")
  for loaded in (teacher, judge):
    assert loaded.cfg.param_dtype == "bfloat16"
    assert {np.asarray(x).dtype.name for x in runs.flat(loaded.params).values()} == {"bfloat16"}


def test_one_implementation_of_loading():
  """Only rljax/loading reads a model source's weights (grep, as the design asks)."""
  root = os.path.join(os.path.dirname(__file__), "..", "..", "rljax")
  readers = []
  for folder, _, names in os.walk(root):
    for name in names:
      path = os.path.join(folder, name)
      if name.endswith(".py") and "models" not in os.path.relpath(path, root).split(os.sep)[:1]:
        text = open(path).read()
        if "load_hf(" in text or "has another tokenizer" in text:
          readers.append(os.path.relpath(path, root))
  assert readers == [os.path.join("loading", "loader.py")]
