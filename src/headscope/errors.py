"""Errors that the CLI turns into one line and an exit code, without a traceback."""

from __future__ import annotations

# The longest message the CLI prints: a value echoed from a user's file (a field of a million
# bytes, say) is cut in the middle, so the error stays one short line.
MAX_MESSAGE = 600


def one_line(text: str) -> str:
    """``text`` on one line: line breaks of any kind shown as the escapes a reader would type."""
    return "".join(_LINE_BREAKS.get(ch, ch) for ch in text) if _has_break(text) else text


_LINE_BREAKS = {
    "\n": "\\n",
    "\r": "\\r",
    "\x0b": "\\x0b",
    "\x0c": "\\x0c",
    "\x1c": "\\x1c",
    "\x1d": "\\x1d",
    "\x1e": "\\x1e",
    "\x85": "\\x85",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def _has_break(text: str) -> bool:
    return any(ch in text for ch in _LINE_BREAKS)


def elide(value: object, limit: int = 80) -> str:
    """A user's value for a message: one line, at most about ``limit`` characters, middle cut.

    Strings are shown as they are (no quotes added); anything else as its ``repr``.
    """
    text = one_line(value if isinstance(value, str) else repr(value))
    if len(text) <= limit:
        return text
    keep = max(limit - 20, 10)
    head, tail = keep * 2 // 3, keep - keep * 2 // 3
    return f"{text[:head]}…[{len(text) - head - tail} chars]…{text[-tail:]}"


class HeadscopeError(Exception):
    """Base class. ``exit_code`` 2 means bad usage or input; 1 means the run failed."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        message = elide(self.message, MAX_MESSAGE)
        return message if not self.hint else f"{message} ({elide(self.hint, MAX_MESSAGE // 2)})"


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
