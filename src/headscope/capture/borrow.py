"""Borrowing a model for the length of an analysis, and giving its state back exactly.

:func:`borrowed` is the one borrow: every forward pass headscope makes (``capture.run``, the checks,
path patching, the cost ledger's bare forward) and every analysis (``extend.protocol.execute``)
runs inside it. It switches the model to the attention implementation of its capture mode and to
eval mode, and gives everything back on exit (peft's ``disable_adapter()``: borrow inside a context
manager, give back exactly, also on error).

Which attention implementation a capture mode uses is declared by the module that provides it
(:func:`use_attention`): ``eager`` is transformers' own, and :mod:`headscope.capture.stream`, which
importing :mod:`headscope.capture` always imports, declares its streaming function. So the borrow
imports no forward pass, and the pass and the ledger both import the borrow.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# One borrow of a model object at a time: a second analysis of the same object (another thread)
# waits for the first. Waiting, not refusing: the results are then exactly those of two runs one
# after the other, and a model runs one forward pass at a time anyway. Re-entrant, so an analysis'
# own nested uses in the same thread go through. Keyed by the model object, not the LoadedModel:
# two hs.load(model, tokenizer) wrappers of one model share it.
_BORROWS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_BORROWS_LOCK = threading.Lock()
# Module state that transformers' output capturing adds and a borrow must take back.
_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_HOOKED_FLAG = "_output_capturing_hooks_installed"


def borrow_lock(model: Any) -> threading.RLock:
    with _BORROWS_LOCK:
        lock = _BORROWS.get(model)
        if lock is None:
            lock = _BORROWS[model] = threading.RLock()
        return lock


@dataclass
class _ModelState:
    """What a borrow must give back: every module's hooks and train/eval flag, transformers'
    hooked-once flag, and every parameter's ``requires_grad`` and ``.grad``."""

    hooks: list[tuple[Any, str, set[Any]]]
    flags: list[tuple[Any, bool]]
    hooked: list[Any]
    params: list[tuple[Any, bool, Any]]

    @classmethod
    def of(cls, model: Any) -> _ModelState:
        modules = list(model.modules())
        return cls(
            hooks=[
                (m, name, set(getattr(m, name))) for m in modules for name in _HOOK_DICTS if hasattr(m, name)
            ],
            flags=[(m, m.training) for m in modules],
            hooked=[m for m in modules if _HOOKED_FLAG in vars(m)],
            params=[(p, p.requires_grad, p.grad) for p in model.parameters()],
        )

    def restore(self, model: Any) -> None:
        for module, name, keys in self.hooks:
            hooks = getattr(module, name)
            for key in [k for k in hooks if k not in keys]:
                del hooks[key]
        for module, training in self.flags:
            module.training = training
        before = {id(m) for m in self.hooked}
        for module in model.modules():
            if _HOOKED_FLAG in vars(module) and id(module) not in before:
                delattr(module, _HOOKED_FLAG)
        for parameter, requires_grad, grad in self.params:
            if parameter.requires_grad != requires_grad:
                parameter.requires_grad_(requires_grad)
            if parameter.grad is not grad:
                parameter.grad = grad


# capture mode -> (the attention implementation a borrow switches to, what registers it first).
_ATTENTION: dict[str, tuple[str, Callable[[], None] | None]] = {"eager": ("eager", None)}


def use_attention(capture_mode: str, implementation: str, setup: Callable[[], None] | None = None) -> None:
    """Borrows of a model whose capture mode is ``capture_mode`` switch it to ``implementation``,
    calling ``setup()`` first (it registers the implementation with transformers; called on each
    borrow that may switch, so it must return at once when already done)."""
    _ATTENTION[capture_mode] = (implementation, setup)


def _attention(capture_mode: str) -> tuple[str, Callable[[], None] | None]:
    if capture_mode not in _ATTENTION:
        raise RuntimeError(
            f"no attention implementation declared for capture mode {capture_mode!r} "
            "(headscope.capture.stream declares 'stream' when it is imported)"
        )
    return _ATTENTION[capture_mode]


@contextlib.contextmanager
def borrowed(loaded: Any) -> Iterator[Any]:
    """Switch a caller's model to headscope's attention implementation and eval mode; restore on exit.

    A model headscope loaded itself (``loaded.owned``) is switched on first use and left so.
    Nested uses (an analysis whose forward passes also ask) switch once. One borrow of a model
    object at a time (:func:`borrow_lock`: a second thread waits). On exit the caller's model gets
    back, in ``finally`` (an exception or Ctrl-C included), its attention implementation, every
    module's train/eval flag and hooks (transformers' output-capturing hooks, installed by an
    ``output_attentions=True`` pass, are taken off again, so ``torch.save`` and ``pickle`` work as
    before), and every parameter's ``requires_grad`` and ``.grad``; the weights are never written.
    """
    model = loaded.model
    wanted, setup = _attention(loaded.capture_mode)
    with borrow_lock(model):
        if loaded.owned or loaded.active:
            # headscope's own model is switched on first use and stays so; a nested use is already set.
            if loaded.owned and getattr(model.config, "_attn_implementation", None) != wanted:
                if setup is not None:
                    setup()
                model.set_attn_implementation(wanted)
            loaded.active += 1
            try:
                yield loaded
            finally:
                loaded.active -= 1
            return
        before = getattr(model.config, "_attn_implementation", None)
        state = _ModelState.of(model)
        loaded.active += 1
        switched = False
        try:
            if setup is not None:
                setup()
            if before != wanted:
                model.set_attn_implementation(wanted)
                switched = True
            model.eval()
            yield loaded
        finally:
            loaded.active -= 1
            if switched:
                model.set_attn_implementation(before if before is not None else "eager")
            state.restore(model)
