"""A user's mistake on the command line is one ``error: ...`` line naming the key or file and what
to do, with exit status 2, found before the run dir is claimed (issue 22's probes)."""
import json
import os

import pytest

from rljax import cli, models
from rljax.config import loader as config_loader
from rljax.models import transformer
from rljax.train import policy, startup
from tests.train import tiny

RUN = "{tmp}/run"


def _tiny_hf(path, **config_changes):
  """A Hugging Face directory of the tiny policy (no torch needed), config.json edited."""
  config = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "base.py"),
                                     [(k, v) for k, v in tiny.OVERRIDES.items()
                                      if k.startswith("model.")])
  cfg = models.tiny_config(config.model, 57, eos_token_id=1, pad_token_id=0)
  models.save_hf(str(path), cfg, transformer.init_params(cfg, seed=0))
  if config_changes:
    with open(path / "config.json") as f:
      hf = json.load(f)
    hf.update(config_changes)
    with open(path / "config.json", "w") as f:
      json.dump(hf, f)
  return str(path)


def _truncated(tmp):
  path = _tiny_hf(tmp / "trunc")
  file = os.path.join(path, "model.safetensors")
  with open(file, "r+b") as f:
    f.truncate(os.path.getsize(file) // 2)
  return path


def _bad_json(tmp):
  path = _tiny_hf(tmp / "badjson")
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write('{"model_type": "llama",')
  return path


def _wrong_shape(tmp):
  return _tiny_hf(tmp / "shape", intermediate_size=48)  # the tensors say 64


def _uppercase_prompt(tmp):
  (tmp / "d.jsonl").write_text('{"prompt": "What is 2+2?", "answer": "4"}\n')
  return str(tmp / "d.jsonl")


def _adapter_of_rank(tmp, rank):
  """A PEFT LoRA directory whose adapter_config.json says ``rank`` (the ranks differ before any
  tensor is looked at)."""
  os.makedirs(tmp / "adapter")
  (tmp / "adapter" / "adapter_config.json").write_text(json.dumps(
      {"peft_type": "LORA", "r": rank, "lora_alpha": 32, "target_modules": ["q_proj"]}))
  (tmp / "adapter" / "adapter_model.safetensors").write_bytes(b"")
  return str(tmp / "adapter")


def _symlink_loop(tmp):
  os.symlink(tmp / "b", tmp / "a")
  os.symlink(tmp / "a", tmp / "b")
  return str(tmp / "a")


def _not_a_configdict(tmp):
  path = tmp / "bad_config.py"
  path.write_text("def get_config():\n  return {'seed': 0}\n")
  return str(path)


def _train(extra):
  """``rljax train`` arguments of the tiny GRPO run with ``extra`` overrides (a callable value
  is made from the test's tmp dir)."""
  def argv(tmp):
    rest = {k: v(tmp) if callable(v) else v for k, v in extra.items() if k != "train.run_dir"}
    return tiny.args("grpo", extra.get("train.run_dir", RUN).format(tmp=tmp), rest)
  return argv


# probe -> (argv builder, the start of the line the user sees after "error: ")
PROBES = {
    "config-without-path": (lambda tmp: ["train", "--config"],
                            "--config needs a config file path"),
    "override-without-value": (lambda tmp: ["train", "--config", "configs/algos/grpo.py",
                                            "--config.train.steps"],
                               "--config.train.steps needs a value"),
    "get_config-returns-a-dict": (lambda tmp: ["train", "--config", _not_a_configdict(tmp)],
                                  "get_config() of config file"),
    "unknown-command": (lambda tmp: ["trian"], "unknown command 'trian'"),
    "seed-10**30": (_train({"seed": str(10**30)}),
                    f"seed={10**30} is not allowed: expected an integer >= 0 and <= 4294967295"),
    "hidden_size-10**30": (_train({"model.hidden_size": str(10**30)}),
                           f"model.hidden_size={10**30} is not allowed"),
    "max_skipped_steps=-1": (_train({"train.max_skipped_steps": "-1"}),
                             "train.max_skipped_steps=-1 is not allowed: expected an integer >= 0"),
    "algo.adv_std": (_train({"algo.adv_std": "grp"}), "algo.adv_std='grp' is not allowed: expected one of ['group', 'batch', 'none']"),
    "algo.kl_placement": (_train({"algo.kl_placement": "los"}),
                          "algo.kl_placement='los' is not allowed: expected one of "
                          "['loss', 'reward', 'none']"),
    "algo.advantage": (_train({"algo.advantage": "grpoo"}), "algo.advantage='grpoo' is not allowed: expected a "
                                                        "registered advantage name: dr_grpo, gae"),
    "reward.fn": (_train({"reward.fn": "exact"}), "reward.fn='exact' is not allowed: expected a "
                                                    "registered reward_fn name: "),
    "data.tokenizer": (_train({"data.tokenizer": "/no/such/tok"}),
                       "data.tokenizer='/no/such/tok' is neither 'char' nor"),
    "chat_template-with-char": (_train({"data.chat_template": "true"}),
                                "data.chat_template=True needs a Hugging Face tokenizer"),
    "teacher.source": (_train({"algo.opd_coef": "1.0", "teacher.source": "bogus"}),
                       "teacher.source must be"),
    "teacher-missing-dir": (_train({"algo.opd_coef": "1.0", "teacher.source": "hf:/no/such"}),
                            "teacher.source='hf:/no/such': '/no/such' is not a directory"),
    "model.source": (_train({"model.source": "bogus"}), "model.source must be"),
    "hf-dir-missing": (_train({"model.source": "hf:/no/such"}),
                       "model.source='hf:/no/such': '/no/such' is not a directory"),
    "hf-dir-empty": (_train({"model.source": lambda tmp: "hf:" + str(tmp)}), "model.source="),
    "hf-gpt2": (_train({"model.source": lambda tmp: "hf:" + _tiny_hf(tmp / "g",
                                                                     model_type="gpt2")}),
                "model.source="),
    "hf-gemma": (_train({"model.source": lambda tmp: "hf:" + _tiny_hf(tmp / "g",
                                                                      model_type="gemma")}),
                 "model.source="),
    "hf-wrong-shape": (_train({"model.source": lambda tmp: "hf:" + _wrong_shape(tmp)}),
                       "model.source="),
    "hf-truncated-safetensors": (_train({"model.source": lambda tmp: "hf:" + _truncated(tmp)}),
                                 "model.source="),
    "hf-invalid-config.json": (_train({"model.source": lambda tmp: "hf:" + _bad_json(tmp)}),
                               "model.source="),
    "prompt-the-char-tokenizer-cannot-encode": (
        _train({"data.source": lambda tmp: "jsonl:" + _uppercase_prompt(tmp)}),
        "{tmp}/d.jsonl:1: character 'W' in 'What is 2+2?' is not in the char tokenizer's "
        "vocabulary"),
    "lora-init-from-missing": (
        _train({"model.lora.rank": "4", "model.lora.init_from": "/no/such"}),
        "model.lora.init_from: '/no/such' is not a PEFT adapter directory (no "
        "adapter_config.json)"),
    "lora-init-from-other-rank": (
        _train({"model.lora.rank": "4",
                "model.lora.init_from": lambda tmp: _adapter_of_rank(tmp, 2)}),
        "model.lora.init_from: the PEFT adapter '{tmp}/adapter' has rank r=2 but "
        "model.lora.rank=4: set model.lora.rank=2"),
    "gs-run-dir": (_train({"train.run_dir": "gs://bucket/run"}),
                   "train.run_dir='gs://bucket/run': run directories on object storage (gs://) "
                   "are not supported yet"),
    "symlink-loop-run-dir": (lambda tmp: _train({"train.run_dir": _symlink_loop(tmp)})(tmp),
                             "cannot use train.run_dir="),
}
# Where the line must name the file, not only the key.
NAMES_FILE = {"hf-truncated-safetensors": "model.safetensors is not a readable safetensors file",
              "hf-invalid-config.json": "config.json is not readable JSON",
              "hf-wrong-shape": "'model.layers.0.mlp.down_proj.weight' has shape (32, 64), "
                                "expected (32, 48)",
              "hf-dir-empty": "no config.json in",
              "hf-gpt2": "config.json: unsupported architecture model_type='gpt2' "
                         "(['LlamaForCausalLM']); supported: "
                         "gemma3, gemma3_text, llama, mistral, qwen2, qwen2_5_vl, qwen3, "
                         "qwen3_moe, qwen3_vl",
              "hf-gemma": "config.json: unsupported architecture model_type='gemma'"}


@pytest.fixture
def nothing_is_loaded(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("weights were loaded before the start-up checks")
  monkeypatch.setattr(policy, "load_policy", refuse)


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_user_error_is_one_line_with_exit_status_2(probe, tmp_path, capsys, nothing_is_loaded):
  make_argv, expected = PROBES[probe]
  argv = make_argv(tmp_path)
  with pytest.raises(SystemExit) as info:
    cli.entry(argv)
  err = capsys.readouterr().err
  assert info.value.code == 2, err
  assert err.startswith("error: " + expected.format(tmp=tmp_path)), err
  assert NAMES_FILE.get(probe, "") in err
  assert err.count("\n") == 1 and "Traceback" not in err
  assert not os.path.exists(tmp_path / "run")  # nothing claimed


def test_prompts_per_step_not_divisible_is_found_before_the_run_dir(tmp_path, capsys,
                                                                      monkeypatch,
                                                                      nothing_is_loaded):
  monkeypatch.setattr(startup.rules, "batch_divisor", lambda mesh: 4)  # as on 4 data devices
  with pytest.raises(SystemExit) as info:
    cli.entry(tiny.args("grpo", str(tmp_path / "run"), {"rollout.prompts_per_step": "6"}))
  assert info.value.code == 2
  assert capsys.readouterr().err.startswith(
      "error: rollout.prompts_per_step=6 must be a multiple of the data-parallel width "
      "(mesh data x fsdp x expert = 4)")
  assert not os.path.exists(tmp_path / "run")


def test_internal_error_keeps_its_traceback_and_status_1(monkeypatch):
  def bug(argv):
    raise ZeroDivisionError("a bug in rljax")
  monkeypatch.setitem(cli.COMMANDS, "components", bug)
  with pytest.raises(ZeroDivisionError):  # uncaught: Python prints it and exits 1
    cli.entry(["components"])


def test_hf_tokenizer_without_eos_or_chat_template(tmp_path):
  from tokenizers import Tokenizer, models as tok_models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast
  from rljax.data import tokenizer as tokenizer_lib
  from rljax.errors import TokenizerError
  vocab = {c: i for i, c in enumerate(["<pad>", "<eos>"] + list("0123456789+="))}
  tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
  PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>").save_pretrained(
      tmp_path / "noeos")
  PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>"
                          ).save_pretrained(tmp_path / "nochat")
  with pytest.raises(TokenizerError, match=r"data.tokenizer='.*noeos' defines no eos_token"):
    tokenizer_lib.load_tokenizer(str(tmp_path / "noeos"))
  with pytest.raises(TokenizerError, match=r"no chat template.*set data.chat_template=False"):
    tokenizer_lib.load_tokenizer(str(tmp_path / "nochat"), chat_template=True)
  assert tokenizer_lib.load_tokenizer(str(tmp_path / "nochat")).eos_id == 1
