"""Llama-family decoder in Flax NNX, its functional KV cache, value head and HF interop."""
from rljax.models.config import ModelConfig, matmul_precision, tiny_config
from rljax.models.hf import check_conversion, check_hf_dir, load_hf, save_hf
from rljax.models.llama import (LayerCache, Transformer, bind, cached_step, forward, head_weight,
                                init_cache, init_params, logical_axes, logits, param_shapes,
                                positions_from_mask)
