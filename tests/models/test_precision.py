"""``rljax.load``'s precision policy and ``Model.logits`` in chunks."""
import jax
import jax.numpy as jnp
import numpy as np

import rljax
from rljax.models import transformer
from rljax.models.config import compute_dtype


def test_auto_dtype_is_bf16_compute_on_accelerators_and_float32_on_cpu():
  assert compute_dtype("auto", "cpu") == "float32"
  assert compute_dtype("auto", "gpu") == compute_dtype("auto", "tpu") == "bfloat16"
  assert compute_dtype("float16", "gpu") == "float16"


def test_load_dtype_and_chunked_logits_equal_the_full_forward():
  model = rljax.load("tiny", dtype="bfloat16")
  assert model.cfg.dtype == "bfloat16" and model.cfg.param_dtype == "float32"
  assert {x.dtype for x in jax.tree.leaves(model.params)} == {jnp.dtype("float32")}
  model = rljax.load("tiny")  # float32 on this CPU
  tokens = np.array([[0, 0, 5, 6, 7, 9, 4], [3, 4, 5, 6, 7, 8, 2]])
  chunked = model.logits(tokens, chunk=3)  # chunks of 3, 3 and 1 positions
  full = np.asarray(transformer.logits(model.cfg, model.params, tokens,
                                       (tokens != model.tokenizer.pad_id).astype(np.int32)))
  assert chunked.shape == full.shape and chunked.dtype == np.float32
  np.testing.assert_allclose(chunked, full, atol=1e-5)
