"""The one place headscope installs hooks on a model's modules.

Every forward hook headscope puts on a model goes through :func:`hooked`: the hooks live for the
``with`` block and every handle is removed in ``finally``, also when the forward pass raises (or is
stopped on purpose, as :func:`headscope.capture.stream.stopping_after` does). A test
(``tests/unit/test_one_pass.py``) checks that no other module of headscope calls
``register_forward_hook`` and its relatives, so a borrowed model cannot be left hooked by code that
forgot its ``finally``. What the hooks do to a pass is declared elsewhere: the edits in
:mod:`headscope.capture.edits`, the reads in the modules that read (:class:`~headscope.capture.dla.HeadWrites`,
the checks, path patching's recording pass).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch


class Hooks:
    """The hooks of one ``with hooked()`` block: add them with :meth:`before` and :meth:`after`."""

    def __init__(self) -> None:
        self._handles: list[Any] = []

    def before(self, module: torch.nn.Module, hook: Callable[..., Any], *, with_kwargs: bool = False) -> None:
        """``hook(module, args)`` (or ``(module, args, kwargs)``) before ``module`` runs; what it
        returns, if not None, replaces the arguments (torch's forward pre-hook)."""
        self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=with_kwargs))

    def after(self, module: torch.nn.Module, hook: Callable[..., Any], *, with_kwargs: bool = False) -> None:
        """``hook(module, args, output)`` after ``module`` runs; what it returns, if not None,
        replaces the output (torch's forward hook)."""
        self._handles.append(module.register_forward_hook(hook, with_kwargs=with_kwargs))

    def __len__(self) -> int:
        return len(self._handles)

    def remove(self) -> None:
        """Remove every hook added so far (last first)."""
        while self._handles:
            self._handles.pop().remove()


@contextlib.contextmanager
def hooked() -> Iterator[Hooks]:
    """Hooks for the length of the block, every one removed in ``finally``."""
    hooks = Hooks()
    try:
        yield hooks
    finally:
        hooks.remove()
