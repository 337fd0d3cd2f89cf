"""The one hook that does not depend on the vLLM version: where an engine's config is settled.

Every vLLM with the v1 engine builds a ``VllmConfig`` and hands it, once settled, to
``current_platform.check_and_update_config(vllm_config)``. The plugin wraps that method of the
current platform's class so it can look at ``vllm_config.cache_config.cache_dtype`` in the front
process, before a model is loaded or an engine process started. For any other dtype the wrapper
returns what the original returned and does nothing else.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ._errors import IncompatibleVLLMError

_GUARD_MARK = "_kvquant_int8_guard"


def install_config_guard(decide: Callable[[Any], None]) -> None:
    """After the platform settles a config, call ``decide(vllm_config)``; it may raise a refusal.

    Installing twice in one process (vLLM loads plugins once per process, tests call ``register``
    again) replaces the decision and does not stack wrappers.
    """
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    current = inspect.getattr_static(platform_cls, "check_and_update_config", None)
    if not isinstance(current, classmethod):
        raise IncompatibleVLLMError(
            f"{platform_cls.__name__}.check_and_update_config is not a classmethod in this vLLM; "
            "the plugin cannot see the engine's --kv-cache-dtype"
        )
    original = getattr(current.__func__, _GUARD_MARK, current.__func__)
    parameters = list(inspect.signature(original).parameters)
    if parameters[1:] != ["vllm_config"]:
        raise IncompatibleVLLMError(
            f"{platform_cls.__name__}.check_and_update_config takes {parameters[1:]}; "
            "expected (vllm_config)"
        )

    def check_and_update_config(cls: type, vllm_config: Any) -> Any:
        result = original(cls, vllm_config)
        decide(vllm_config)
        return result

    setattr(check_and_update_config, _GUARD_MARK, original)
    check_and_update_config.__doc__ = original.__doc__
    platform_cls.check_and_update_config = classmethod(check_and_update_config)
