"""The error types minfer raises for problems a user can fix.

Every user-facing failure is a `MinferError` carrying one line that names what is
wrong (file, tensor, key, flag). The CLI prints that line and exits non-zero; it
never shows a traceback for these.
"""


class MinferError(Exception):
    """Base class: a problem with the user's input or environment, described in one line."""


class ModelFileError(MinferError):
    """A model file is missing, truncated, corrupt or unsupported."""


class ModelNotFoundError(MinferError):
    """A model name or path does not resolve to a file; the message says how to fetch it."""


class TokenizerError(MinferError):
    """The tokenizer metadata in a GGUF cannot be used."""


class TemplateError(MinferError):
    """A chat template cannot be rendered."""


class ContextOverflowError(MinferError):
    """A request does not fit in the context window."""


class BackendError(MinferError):
    """A backend cannot run the graph (missing kernels, no device, unsupported op)."""


class NumericalError(MinferError):
    """A forward pass produced NaN or Inf where a number was needed (the logits a token is picked from)."""


class EngineBusyError(MinferError):
    """An Engine was asked for a second generation (or forward pass) while one is running: it runs one at a time."""


class GrammarError(MinferError):
    """A constraint on the output cannot be used: a JSON schema the grammar engine rejects (the message says why)."""
