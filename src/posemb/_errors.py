"""posemb's exceptions for input it refuses: one type, so a caller (and ``posemb``'s command
line) can tell "you asked for something posemb does not do" from a bug in posemb.

Every refusal of an argument, a config key or a file raises :class:`InputError`, whose message
names the argument, the value and what is allowed. It is a ``ValueError``, so code written
against releases that raised ``ValueError`` still catches it. Anything else escaping posemb (a
``KeyError``, a ``TypeError`` from torch, a plain ``ValueError`` from another library) is not
posemb refusing input: the command line shows its traceback and exits 1.
"""

from __future__ import annotations


class InputError(ValueError):
    """Input posemb refuses; the message names the argument, the value and what is allowed."""


class BackendUnavailable(InputError, RuntimeError):
    """The backend asked for cannot run here (no compiled op, no GPU, no Triton); the message
    says why. A ``RuntimeError`` too, as it was before :class:`InputError` existed."""


__all__ = ["BackendUnavailable", "InputError"]
