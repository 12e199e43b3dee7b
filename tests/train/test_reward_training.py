"""``rljax rm``: Bradley-Terry training on pairs from a learnable rule, held-out accuracy, the run
dir (checkpoints, exports) and its export scored alike by ``transformers``."""
import json
import os

import jax
import numpy as np
import pytest

from rljax import cli, models
from rljax.data import preferences
from rljax.data.tokenizer import CharTokenizer
from rljax.errors import DataError
from rljax.models import transformer
from rljax.rewards import reward_model
from rljax.config.sources import parse_source
from rljax.loading import loader
from rljax.train import reward_training
from tests import hf_models
from tests.train.tiny import ROOT

_scores = jax.jit(transformer.sequence_scores, static_argnums=0)


def rule_pairs(n: int, seed: int) -> list[dict]:
  """The rule: the prompt asks for 'z' or 'y' (at random); the chosen response holds the asked
  character, the rejected one the other, at the same place of otherwise equal text. Neither
  character nor length tells the two apart, only the prompt does: an untrained model is right
  about half the time."""
  rng = np.random.default_rng(seed)
  digits = "0123456789"
  out = []
  for _ in range(n):
    asked, other = ("z", "y") if rng.random() < 0.5 else ("y", "z")
    prompt = "".join(rng.choice(list(digits), 3)) + asked + "="
    plain = "".join(rng.choice(list(digits + " ab"), int(rng.integers(3, 8))))
    at = int(rng.integers(0, len(plain) + 1))
    out.append({"prompt": prompt, "chosen": plain[:at] + asked + plain[at:],
                "rejected": plain[:at] + other + plain[at:]})
  return out


def write_jsonl(path, rows) -> str:
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return str(path)


RM_ARGS = {"model.hidden_size": "32", "model.intermediate_size": "64", "model.num_layers": "1",
           "model.num_heads": "2", "model.num_kv_heads": "1", "rm.steps": "30",
           "rm.batch_size": "16", "rm.max_tokens": "24", "rm.eval_every": "15",
           "optim.lr": "3e-3", "optim.warmup_steps": "5", "train.progress": "false",
           "train.checkpoint_every": "10", "train.keep_checkpoints": "2"}


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory):
  """One `rljax rm` run on 400 rule pairs (10% held out); the result and its run dir."""
  root = tmp_path_factory.mktemp("rm_run")
  pairs = write_jsonl(root / "pairs.jsonl", rule_pairs(400, seed=0))
  run_dir = str(root / "run")
  args = dict(RM_ARGS, **{"rm.train_file": pairs, "train.run_dir": run_dir})
  result = cli.main(["rm", "--config", os.path.join(ROOT, "configs", "tasks", "rm.py")]
                    + [f"--config.{k}={v}" for k, v in args.items()])
  return result, run_dir


def test_learns_the_rule_to_over_90_percent_held_out(rm_run):
  result, run_dir = rm_run
  assert result["eval_accuracy"] > 0.9
  records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
  evals = [r for r in records if "rm/eval_accuracy" in r]
  assert evals[0]["step"] == 0 and evals[0]["rm/eval_accuracy"] < 0.8  # it learned it here
  assert [r["step"] for r in evals] == [0, 15, 30]


def test_run_dir_holds_checkpoints_and_an_export_per_checkpoint(rm_run):
  """Checkpoints every 10 steps, 2 kept: 20 and 30, and their exports (10's went with it)."""
  _, run_dir = rm_run
  assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["20", "30"]
  assert sorted(os.listdir(os.path.join(run_dir, reward_model.STEP_EXPORTS))) == ["20", "30"]
  # run:DIR@STEP reads checkpoint STEP (its export), run:DIR the latest: the final model, hf/.
  for text, export in ((f"run:{run_dir}@20", os.path.join("exports", "20")), (f"run:{run_dir}", "hf")):
    _, read = loader.read_run(parse_source(text), head="score")
    _, want = models.load_hf(os.path.join(run_dir, export), head="score")
    assert jax.tree.all(jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
                                     read, want)), text


def test_export_scores_alike_in_transformers(rm_run):
  _, run_dir = rm_run
  path = os.path.join(run_dir, "hf")
  cfg, params = models.load_hf(path, head="score")
  tok = CharTokenizer()
  held = rule_pairs(4, seed=9)
  tokens, mask = reward_training.encode_pairs(tok, [preferences.Pair(**p) for p in held], 24)
  tokens, mask = tokens.reshape(8, 24), mask.reshape(8, 24)
  ours = np.asarray(_scores(cfg, params, tokens, mask))
  theirs = hf_models.hf_scores(path, tokens, mask)
  assert np.abs(ours - theirs).max() <= 1e-4
  assert (ours[0::2] > ours[1::2]).all()  # each chosen row above its rejected one


def test_bradley_terry_loss_by_hand():
  loss, acc = reward_training.bradley_terry(np.array([2.0, 0.0]), np.array([0.0, 1.0]))
  want = (np.log1p(np.exp(-2.0)) + np.log1p(np.exp(1.0))) / 2  # -log sigmoid(m) = log(1+e^-m)
  assert abs(float(loss) - want) < 1e-6 and float(acc) == 0.5


def test_a_bad_pair_line_is_named(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": 1}\n')
  with pytest.raises(DataError, match=r"bad\.jsonl:2: field 'chosen' is 1, not a string"):
    preferences.read_pairs(str(path))


def test_batches_cover_every_pair_once_per_epoch():
  seen = np.concatenate([preferences.batch_indices(10, 4, s, seed=3) for s in range(5)])
  assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
  assert list(preferences.batch_indices(10, 4, 3, seed=3)) == list(seen[12:16])


def test_the_run_is_read_back_as_the_source_rm(rm_run):
  """``reward.model.source='run:DIR'``: the export DIR/hf, with the run's own tokenizer (char:
  the policy's ids are reused); a chat-template setting other than the run's is refused."""
  from rljax.config.table import get_config
  from rljax.errors import StartupError
  from rljax.parallel import mesh as mesh_lib
  from rljax.rewards import sources
  _, run_dir = rm_run
  config = get_config()
  config.reward.model.source = f"run:{run_dir}"
  tok = CharTokenizer()
  rm = loader.reward_model(config, tok, mesh_lib.make_mesh(config.mesh))
  assert rm.reuse_ids
  pairs = [preferences.Pair(**p) for p in rule_pairs(4, seed=5)]
  tokens, mask = reward_training.encode_pairs(tok, pairs, 24)
  prompt = [tok.encode_prompt(p.prompt) for p in pairs]
  completion = [tok.encode(p.chosen) + [tok.eos_id] for p in pairs]
  left = lambda rows, n: np.stack([np.pad(r, (n - len(r), 0)) for r in rows]).astype(np.int32)
  right = lambda rows, n: np.stack([np.pad(r, (0, n - len(r))) for r in rows]).astype(np.int32)
  batch = sources.RewardBatch(  # the chosen rows as a rollout holds them
      prompts=[p.prompt for p in pairs], completions=[p.chosen for p in pairs],
      problems=[None] * 4, prompt_tokens=left(prompt, 16),
      prompt_mask=left([[1] * len(r) for r in prompt], 16), tokens=right(completion, 12),
      mask=right([[1] * len(r) for r in completion], 12))
  cfg, params = models.load_hf(os.path.join(run_dir, "hf"), head="score")
  want = np.asarray(_scores(cfg, params, tokens[:, 0], mask[:, 0]))
  np.testing.assert_allclose(rm(batch), want, atol=1e-5)  # same text, same ids, other padding
  config.reward.model.chat_template = True
  with pytest.raises(StartupError, match="was trained with data.chat_template=False"):
    loader.reward_model(config, tok, mesh_lib.make_mesh(config.mesh))


def test_starts_from_a_causal_lm_trunk_or_a_classifier(hf_dirs, tmp_path):
  """hf: of a causal LM: its trunk and a fresh score head, no vocabulary head; hf: of a sequence
  classifier: all of it, score included."""
  from rljax.config.table import get_config
  config = get_config()
  config.model.source = f"hf:{hf_dirs['llama']}"
  cfg, params = reward_training.initial_params(config, CharTokenizer())
  _, lm = models.load_hf(hf_dirs["llama"])
  assert "lm_head" not in params and params["score"]["kernel"].shape == (cfg.hidden_size, 1)
  np.testing.assert_array_equal(params["embed_tokens"], lm["embed_tokens"])
  assert cfg.pad_token_id == 0  # the checkpoint's; exported with it
  classifier = hf_models.build_reward_model("qwen2", str(tmp_path / "rm"))
  config.model.source = f"hf:{classifier}"
  _, params = reward_training.initial_params(config, CharTokenizer())
  _, saved = models.load_hf(classifier, head="score")
  np.testing.assert_array_equal(params["score"]["kernel"], saved["score"]["kernel"])


def test_rm_errors_are_one_line(tmp_path, capsys):
  args = ["rm", "--config", os.path.join(ROOT, "configs", "tasks", "rm.py"),
          f"--config.train.run_dir={tmp_path / 'run'}"]
  with pytest.raises(SystemExit):
    cli.entry(args)
  assert capsys.readouterr().err.strip() == (
      'error: rljax rm needs rm.train_file: a JSONL file of {"prompt", "chosen", "rejected"} '
      "pairs")
  pairs = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "1+1=", "chosen": "2" * 40,
                                                 "rejected": "3"}] * 3)
  with pytest.raises(SystemExit):
    cli.entry(args + [f"--config.rm.train_file={pairs}", "--config.rm.max_tokens=16"])
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "long.jsonl:" in err and "more than rm.max_tokens=16" in err
  assert not os.path.exists(tmp_path / "run")  # refused before the run dir is claimed
