"""Exceptions raised by kvquant. Only the CLI turns them into exit codes."""


class KVQuantError(Exception):
    """Base class of every error kvquant raises on purpose."""


class InvalidInputError(KVQuantError, ValueError):
    """An argument has the wrong dtype, shape, device or value; raised before any kernel runs.

    The message is one line that names the argument, the value seen and what was expected.
    """


class KernelUnavailableError(KVQuantError, RuntimeError):
    """The kernels cannot run on the requested device in this process.

    For example CPU tensors while Triton was imported without ``TRITON_INTERPRET=1``.
    """
