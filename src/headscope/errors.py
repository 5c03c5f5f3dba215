"""Errors that the CLI turns into one line and an exit code, without a traceback."""

from __future__ import annotations


class HeadscopeError(Exception):
    """Base class. ``exit_code`` 2 means bad usage or input; 1 means the run failed."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class ModelNotFoundError(HeadscopeError):
    """The model spec names no alias, local directory, .gguf file or cached hub model."""


class ModelLoadError(HeadscopeError):
    """The model was found but could not be loaded."""


class PromptSetError(HeadscopeError):
    """A prompt-set file is missing or malformed. The message names file and line."""


class InputError(HeadscopeError):
    """An option value or an input is out of range (too long for the context, and so on)."""


class OutputError(HeadscopeError):
    """An output path cannot be written."""


class RunFailure(HeadscopeError):
    """Something went wrong while running the model."""

    exit_code = 1


class NotApplicable(HeadscopeError):
    """The analysis has nothing to score on this model; the CLI says so on stdout and exits 0."""

    exit_code = 0


class Unsupported(RunFailure):
    """headscope cannot report this view of this model faithfully (a check on the model failed, or
    the architecture computes something its decomposition does not describe); the message says why."""
