"""Tiny, offline Hugging Face causal LMs for any architecture in the causal-LM auto-mapping.

:data:`CAUSAL_SIZES` extends :data:`tests.helpers.tiny_hf.TINY` with the size names
decoder-only configs use beside the seq2seq ones (GPT-2's ``n_embd``, mixture-of-experts
routing, multi-head latent attention ranks, linear-attention and state-space widths), so
that every one of them builds with a few thousand parameters; :data:`EXTRA` holds what a
single architecture needs beyond that (read off its config class's validation), and
:func:`tiny_causal_config` makes sure a hybrid model keeps at least one attention layer in
its two. :func:`tiny_hf.save_checkpoint` writes the folder.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from tests.helpers.tiny_hf import (
    D_MODEL,
    FFN,
    HEAD_DIM,
    HEADS,
    LAYERS,
    POSITIONS,
    TINY,
    VOCAB,
    default_config,
    save_checkpoint,
)
from tests.helpers.tiny_hf import tiny_config as _tiny_config

CAUSAL_SIZES: dict[str, Any] = {
    **TINY,
    # GPT-2 / GPT-J / CodeGen / Bloom names
    "n_embd": D_MODEL, "n_layer": LAYERS, "n_head": HEADS, "n_positions": POSITIONS,
    "n_ctx": POSITIONS, "n_inner": FFN, "rotary_dim": 4, "n_layers": LAYERS,
    "n_heads": HEADS, "emb_dim": D_MODEL, "ffn_dim": FFN, "ffn_hidden_size": FFN,
    "embedding_size": D_MODEL, "unpadded_vocab_size": VOCAB,
    # mixture of experts: two experts, one routed per token
    "num_experts_per_tok": 1, "moe_intermediate_size": FFN, "n_routed_experts": 2,
    "num_local_experts": 2, "n_shared_experts": 1, "num_shared_experts": 1, "n_group": 1,
    "topk_group": 1, "moe_topk": 1, "moe_num_experts": 2, "moe_num_shared_experts": 1,
    "shared_expert_intermediate_size": FFN, "shared_intermediate_size": FFN,
    "num_dense_layers": 1, "first_k_dense_replace": 1,
    # multi-head latent attention
    "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": HEAD_DIM,
    "qk_nope_head_dim": HEAD_DIM, "v_head_dim": HEAD_DIM,
    # sparse-attention indexers
    "index_n_heads": 2, "index_head_dim": HEAD_DIM, "index_topk": 4,
    # linear attention, state spaces, convolutions
    "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": HEAD_DIM,
    "linear_value_head_dim": HEAD_DIM, "linear_conv_kernel_dim": 2, "state_size": 4,
    "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 1, "mamba_chunk_size": 8,
    "chunk_size": 8, "n_groups": 1, "time_step_rank": 4, "mamba_dt_rank": 4,
    "conv_kernel_size": 2, "attention_hidden_size": D_MODEL,
    # per-layer inputs, sliding-window heads
    "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 80,
    "swa_num_attention_heads": HEADS, "swa_num_key_value_heads": 2, "swa_head_dim": HEAD_DIM,
    # multi-token prediction heads are not part of a causal LM's forward
    "num_mtp_layers": 0, "num_nextn_predict_layers": 0,
}

# Per architecture: config arguments beyond the tiny sizes, read off each config class's
# validation (layer patterns sized for two layers, head geometry that must add up).
HYBRID_TWO = {"attn_layer_period": 2, "attn_layer_offset": 1}
PLACEHOLDERS = {"image_token_id": VOCAB - 1, "video_token_id": VOCAB - 2,
                "audio_token_id": VOCAB - 3}
BLT_PART = {"hidden_size": D_MODEL, "num_attention_heads": HEADS, "num_hidden_layers": 1,
            "intermediate_size": FFN, "vocab_size": VOCAB, "max_position_embeddings": POSITIONS}
# Qwen4-Exp's token indexer, with a budget above the prompts' length
QSA = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM,
       "indexer_budget": 16, "indexer_compress_ratio": 4}
EXTRA: dict[str, dict[str, Any]] = {
    "jamba": {**HYBRID_TWO, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "falcon_h1": {"mamba_d_ssm": 64},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "mamba2": {"head_dim": 16},
    # two hybrid layers: Zamba ties every hybrid layer's shared block to the first one's
    # attention reads the hidden states beside the embeddings: twice the width
    "zamba": {"layers_block_type": ["hybrid", "hybrid"], "attention_hidden_size": 2 * D_MODEL,
              "attention_head_dim": 2 * D_MODEL // HEADS},
    "zamba2": {"layers_block_type": ["linear_attention", "hybrid"], "hybrid_layer_ids": [1]},
    "gemma3n_text": {"num_kv_shared_layers": 0,
                     "layer_types": ["sliding_attention", "full_attention"]},
    "ernie4_5_moe": {"moe_k": 1},
    "reformer": {"axial_pos_embds_dim": [16, 16], "axial_pos_shape": [8, 8],
                 "attn_layers": ["local", "local"]},
    "xlm": {"causal": True},
    # below (5 + 2 * num_random_blocks) * block_size tokens BigBird falls back to full
    # attention anyway; as a decoder it is built with it
    "big_bird": {"attention_type": "original_full"},
    "xmod": {"default_language": "en_XX"},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # the attention reads rope_theta off its sub-config, whose class does not define it,
    # and clamps its projections with clip_qkv, which must be set
    "dbrx": {"attn_config": {"kv_n_heads": 1, "rope_theta": 10000.0, "clip_qkv": 8.0}},
    # input, looped and output layers must add up to the two layers
    "dory": {"n_input_layers": 0, "n_output_layers": 1},
    # a routed token's top-k is squeezed, so it must keep two experts per token
    "longcat_flash": {"moe_topk": 2, "zero_expert_num": 1},
    "cohere_compass_text": {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # the multimodal model embeds its placeholder tokens to find them among input
    # embeddings: they must lie in the tiny vocabulary (its last ids, which no prompt uses)
    **dict.fromkeys(["gemma4", "gemma4_unified"], PLACEHOLDERS),
    # BLT's four sub-configs are defaults its config fills in (not ``sub_configs``), so
    # they are sized here, with a small hashed byte n-gram table (500,002 rows by default)
    "blt": {**dict.fromkeys(["patcher_config", "encoder_config", "decoder_config",
                             "global_config"], BLT_PART),
            "encoder_hash_byte_group_vocab": 16, "encoder_hash_byte_group_size": [3],
            "local_attention_window_len": 8},
    "qwen4_exp_text": QSA, "qwen4_exp": {"text_config": QSA},
    # the causal LM takes the text config; the vision and audio towers beside it must still
    # build at the tiny sizes: no per-layer experts past the two layers, adapters and heads
    # sized to the tiny width (heads are per-layer in the text config, so not in the sizes)
    "dots3_note": {"vision_config": {"per_layer_config": {}, "num_attention_heads": HEADS,
                                     "adapter_in_dim": D_MODEL, "adapter_out_dim": D_MODEL},
                   "audio_config": {"num_attention_heads": HEADS,
                                    "adapter_input_size": D_MODEL, "adapter_out_dim": D_MODEL}},
    # the assistant's text model takes no per-layer inputs (its default one does, which its
    # own validation refuses)
    "gemma4_assistant": {"text_config": {"hidden_size_per_layer_input": 0,
                                         "vocab_size_per_layer_input": 0}},
    # its keys and values are rounded to NVFP4 in blocks of 16 (transformers 5.25)
    "kolibri1_1": {"head_dim": 16, "index_num_heads": 1},
}

# Layer types without attention, in the names hybrid configs give them.
NOT_ATTENTION = ("linear_attention", "conv", "mamba", "recurrent", "moe", "mlp")


def tiny_causal_config(config_cls: type, model_cls: type, arch: str) -> Any:
    """A tiny config for ``model_cls`` (the text config of a composite ``config_cls`` when
    the model takes that), with ``is_decoder`` set (BERT-style models are causal only as
    decoders); a hybrid's two layers keep one attention layer. A size that the class
    holds per layer (not globally) is left at its default."""
    extra = {"is_decoder": True, **EXTRA.get(arch, {})}
    sizes = dict(CAUSAL_SIZES)
    while True:
        try:
            config = _tiny_config(config_cls, extra, sizes)
            break
        except Exception as exc:  # transformers' per-layer attribute error names the size
            name = str(exc).split("'")[1] if "per-layer attribute" in str(exc) else None
            if name not in sizes:
                raise
            del sizes[name]
    wanted = getattr(model_cls, "config_class", None)
    if wanted is not None and not isinstance(config, wanted) and hasattr(config,
                                                                        "get_text_config"):
        config = config.get_text_config()
    if getattr(config, "kv_lora_rank", None):  # latent attention: keys per query head
        config.num_key_value_heads = config.num_attention_heads
    default = default_config(config_cls, extra)
    default = default.get_text_config() if hasattr(default, "get_text_config") else default
    for attr in ("layer_types", "layers_block_type"):
        types, every = getattr(config, attr, None), getattr(default, attr, None) or []
        attention = [t for t in every if t not in NOT_ATTENTION] or ["full_attention"]
        if isinstance(types, list) and types and all(t in NOT_ATTENTION for t in types):
            types[-1] = attention[0]
    return config


def tiny_causal_checkpoint(arch: str, folder: Path) -> tuple[Path, Any]:
    """A tiny seeded checkpoint of the causal-LM architecture ``arch`` saved to ``folder``
    (skipped where the installed transformers has no such model type), and its word-level
    tokenizer."""
    import pytest
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if arch not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {arch}")
    model_cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[arch])
    save_checkpoint(model_cls, tiny_causal_config(CONFIG_MAPPING[arch], model_cls, arch),
                    folder, eos_after=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return folder, transformers.PreTrainedTokenizerFast.from_pretrained(folder)
