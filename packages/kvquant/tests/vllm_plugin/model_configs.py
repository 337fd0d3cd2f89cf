"""Model configs the plugin tests parse (config.json only, never loaded), shared by the
0.32 and 0.18.1 test modules."""

from __future__ import annotations

# Small configs of the two model families the plugin refuses; never loaded, only parsed.
MLA_CONFIG = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 64,
    "q_lora_rank": None,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 32,
    "v_head_dim": 32,
    "n_routed_experts": 1,
    "num_experts_per_tok": 1,
    "first_k_dense_replace": 2,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
}
HYBRID_CONFIG = {
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attn_layer_period": 2,
    "attn_layer_offset": 1,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "num_experts": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
}
