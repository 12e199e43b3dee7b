"""The decoder of every supported family (``families``), one network (``transformer``), its KV
cache (``kv_cache``), value and reward heads and HF interop (``hf``)."""
from rljax.models.config import ModelConfig, matmul_precision, tiny_config
from rljax.models.hf import (check_conversion, check_hf_dir, check_sequence_classifier, load_hf,
                             save_hf)
from rljax.models.transformer import (MoEOut, Transformer, bind, cached_step, forward,
                                      forward_with_routes, head_weight, init_cache, init_params,
                                      logical_axes, logits, param_shapes, positions_from_mask,
                                      sequence_scores)
