"""A forward pass, declared: what it reads and what it edits.

``capture.run(loaded, batches, Pass(reads=[...], edits=[...]))`` is the one way to make a pass.
The reads are :mod:`headscope.capture.reads`' kinds (attention rows or pairs, token losses, final
hidden states, heads' writes, heads' mean outputs, blocks' inputs), at most one of each; the edits
are :mod:`headscope.capture.edits`' (ablate heads, stream KV heads, patch heads' outputs, add a
vector after a block). None entries of either list are skipped, so ``edits=[maybe_ablation]``
reads as it should. Reads are checked when the pass is declared (known kinds, one of each) and
against the model before its first forward (:meth:`Pass.check`); edits by
:func:`headscope.capture.edits.applied`, also before the first forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import reads as _reads
from .batch import Batch
from .edits import Edit
from .reads import Read

R = TypeVar("R")


@dataclass(frozen=True)
class Pass:
    """One forward pass over every batch: its ``reads``, its ``edits``, and two settings.

    ``stop_after`` (streaming capture only) ends each forward pass once block ``stop_after`` has
    run, for a pass that needs only the layers up to it (path patching's senders); it has no final
    states, so no :class:`~headscope.capture.reads.TokenLosses` or
    :class:`~headscope.capture.reads.FinalHidden` read. ``on_batch_done(batch)`` runs after each
    batch, once every read of it is complete (progress, or collecting a read's per-batch result).
    """

    reads: Iterable[Read | None] = ()
    edits: Iterable[Edit | None] = ()
    stop_after: int | None = None
    on_batch_done: Callable[[Batch], None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads", _reads.listed(self.reads))
        object.__setattr__(self, "edits", tuple(edit for edit in self.edits if edit is not None))

    def read(self, kind: type[R]) -> R | None:
        """The pass's read of ``kind``, or None."""
        for read in self.reads:  # type: ignore[attr-defined]
            if isinstance(read, kind):
                return read
        return None

    def check(self, loaded: Any) -> None:
        """Refuse what ``loaded`` cannot give, naming the read (streaming-only reads in eager capture,
        token losses without an LM head, final states from a pass that stops early)."""
        _reads.check(loaded, self.reads, self.stop_after)  # type: ignore[arg-type]


__all__ = ["Pass"]
