"""Exceptions of the accuracy benchmark. Only the CLI turns them into exit codes."""


class AccuracyError(Exception):
    """Base class of every error the accuracy benchmark raises on purpose; one line each."""


class ConfigError(AccuracyError):
    """The accuracy config file is missing, not TOML, or has a wrong or unknown key."""


class OutputError(AccuracyError):
    """The output folder or the ``--json`` file cannot be written; checked before the model loads.

    Nothing is created by the check, so a refused run leaves no trace.
    """


class ModelLoadError(AccuracyError):
    """The model path does not exist or holds no loadable causal LM."""


class UnsupportedModelError(AccuracyError):
    """The model has no KV cache to quantize, e.g. an encoder-only model."""


class UnknownTaskError(AccuracyError):
    """A task name is not among the offline tasks shipped in kvbench/accuracy/tasks."""


class BackendMissingError(AccuracyError):
    """The configured backend needs a package (vLLM) that this interpreter cannot import."""


class EngineStartError(AccuracyError):
    """vLLM refused or failed to start an engine for one of the compared caches."""
