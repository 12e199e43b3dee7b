"""The model's functional API under the name code written for the Llama module uses.

The network is ``rljax.models.transformer`` (every family); the Llama/Mistral/Qwen2 blocks are in
``rljax.models.families.llama``.
"""
from rljax.models.layers import apply_rope, rope_inv_freq  # noqa: F401
from rljax.models.transformer import (REMAT_POLICIES, Transformer, bind,  # noqa: F401
                                      cached_step, forward, head_weight, init_cache,
                                      init_params, logical_axes, logits, param_shapes,
                                      positions_from_mask)
