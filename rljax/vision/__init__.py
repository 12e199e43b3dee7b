"""Vision-language models: image towers and the multimodal forward around the one network.

A vision family is a family file plus a tower module: the language model is
``rljax.models.transformer`` (the tower becomes its ``visual`` entry, M-RoPE its positions
[3, B, S]); ``qwen2_5_vl`` is the Qwen2.5-VL tower, its family and the layout its grid sizes
imply; ``gemma3_vl`` Gemma 3's SigLIP tower, projector and family (plain positions, an image's
tokens attending to each other both ways); ``qwen3_vl`` Qwen3-VL's tower (learned positions,
DeepStack) and family; ``multimodal`` runs a batch with images (features merged at the
placeholder tokens, the 3-D positions of ``transformers``' ``get_rope_index``).
"""
