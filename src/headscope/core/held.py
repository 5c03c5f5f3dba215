"""Notices held back until a run goes on.

Loading a model and checking it for an analysis can say things that matter only if the run then
happens: ``BloomForCausalLM does not route attention through AttentionInterface; falling back to
eager output_attentions (...)`` is about the memory of a run that qk's refusal of ALiBi never starts,
and printed above that refusal it buried the one line that counts. The command line holds such
notices (:func:`holding`, from loading through the checks): headscope's log records, Python's
warnings (a library's included) and what the CLI hands to :func:`show` (the loaded model's layout
line). :func:`go_on`, called once the checks pass (:func:`headscope.extend.protocol.execute`), shows
them in the order they came; a refusal drops them, so it stays one line. ``--debug`` holds nothing.

Outside a :func:`holding` block (a library caller, a notebook) nothing is held: :func:`show` shows
at once and :func:`go_on` does nothing. The hold is per context (a :class:`~contextvars.ContextVar`),
so another thread's log is never held by this one's.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

LOGGER = "headscope"  # headscope's log: its handlers' records are held (the CLI's RichHandler)

_HELD: contextvars.ContextVar[list[Callable[[], None]] | None] = contextvars.ContextVar(
    "headscope_held", default=None
)


def show(notice: Callable[[], None]) -> None:
    """Run ``notice`` (something that prints) now, or when the run goes on while a hold is open."""
    held = _HELD.get()
    if held is None:
        notice()
    else:
        held.append(notice)


def go_on() -> None:
    """The run goes on: show what was held, in order, and hold nothing more."""
    held = _HELD.get()
    if held is None:
        return
    _HELD.set(None)
    for notice in held:
        notice()


class _Hold(logging.Filter):
    """On each of headscope's log handlers: a record that comes while a hold is open waits for it."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        held = _HELD.get()
        if held is None:
            return True
        held.append(lambda: self.handler.handle(record))
        return False


@contextlib.contextmanager
def holding(enabled: bool = True) -> Iterator[None]:
    """Hold notices for the block, until :func:`go_on`. What is still held when the block raises (a
    refusal) is dropped; when it ends normally, shown. ``enabled=False`` (``--debug``): hold nothing."""
    if not enabled or _HELD.get() is not None:
        yield
        return
    handlers = list(logging.getLogger(LOGGER).handlers)
    filters = [_Hold(handler) for handler in handlers]
    for handler, hold in zip(handlers, filters, strict=True):
        handler.addFilter(hold)
    shown = warnings.showwarning

    def show_warning(*args: Any, **kwargs: Any) -> None:
        show(lambda: shown(*args, **kwargs))

    warnings.showwarning = show_warning
    token = _HELD.set([])
    try:
        yield
    except BaseException:
        _HELD.set(None)  # refused or failed: the notices were about a run that did not happen
        raise
    else:
        go_on()
    finally:
        _HELD.reset(token)
        if warnings.showwarning is show_warning:
            warnings.showwarning = shown
        for handler, hold in zip(handlers, filters, strict=True):
            handler.removeFilter(hold)


__all__ = ["go_on", "holding", "show"]
