"""Tests of the vLLM plugin (kvquant.vllm_plugin)."""
