"""Why the plugin refuses to start an engine. Every message is one line that starts "kvquant:"."""

from __future__ import annotations

from .. import KVQuantError


class VLLMPluginError(KVQuantError, RuntimeError):
    """The engine asked for an INT8 KV cache that kvquant cannot serve here; nothing was patched."""

    def __init__(self, message: str) -> None:
        # One line by construction: a refusal is read in a log, next to vLLM's own lines.
        super().__init__(" ".join(f"kvquant: {message}".split()))


class UnsupportedVLLMError(VLLMPluginError):
    """The installed vLLM version has no hook module in this plugin."""


class IncompatibleVLLMError(VLLMPluginError):
    """The installed vLLM claims a supported version, but what a hook patches is not as expected."""


class UnsupportedConfigError(VLLMPluginError):
    """The model or engine configuration cannot run on kvquant's INT8 cache (head size, MLA...)."""
