"""Progress bars on stderr (Rich), for the CLI and for ``progress=True`` in the Python API."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from headscope.analyses.base import ProgressFactory


class Bars:
    """``bars(label, total)`` adds a bar and returns ``advance(n)``. ``paused()`` takes the bars off
    the terminal while something else prints (a finished part's tables), and puts them back."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar

    def __call__(self, label: str, total: int) -> Callable[[int], None]:
        task = self.bar.add_task(label, total=total)
        return lambda n: self.bar.advance(task, n)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        # Only a bar drawn on a terminal moves the cursor (and routes stdout through itself).
        live = self.bar.live.is_started and self.bar.console.is_terminal
        if live:
            self.bar.stop()
        try:
            yield
        finally:
            if live:
                self.bar.start()


@contextlib.contextmanager
def progress_bars(console: Console | None = None) -> Iterator[Bars]:
    """Rich progress bars on stderr; NO_COLOR turns them off."""
    console = console or Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=bool(os.environ.get("NO_COLOR")),
    )
    with bar:
        yield Bars(bar)


@contextlib.contextmanager
def progress_option(progress: bool | ProgressFactory | None) -> Iterator[ProgressFactory | None]:
    """The API's ``progress=``: True draws Rich bars (terminal or Jupyter), a callable is the
    caller's own ``factory(label, total) -> advance(n)``, None or False is silent."""
    if progress is True:
        with progress_bars() as factory:
            yield factory
    elif progress is None or progress is False:
        yield None
    elif callable(progress):
        yield progress
    else:
        from headscope.errors import InputError

        raise InputError(f"progress must be True, False, None or a callable, got {type(progress).__name__}")
