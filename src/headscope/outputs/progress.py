"""Progress bars on stderr (Rich), for the CLI and for ``progress=True`` in the Python API; the
CLI's interruptible bars, the parts it prints while a run goes on, and its ``--profile`` line."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from headscope.extend.base import ProgressFactory


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
    """Rich progress bars on stderr; NO_COLOR turns them off, and so does a stderr that is no terminal
    (nor Jupyter): there Rich draws nothing while the bars move and, bars being transient, one blank
    line when they end (above a refusal's one line, or a run's tables)."""
    console = console or Console(stderr=True)
    drawn = console.is_terminal or console.is_jupyter
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=bool(os.environ.get("NO_COLOR")) or not drawn,
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


# Signals received (the CLI's SIGINT handler appends); checked between batches by CheckedBars.
INTERRUPTED: list[int] = []


class CheckedBars:
    """The progress reporter the CLI hands to a run: bars on stderr that also stop the run at the
    next batch after a swallowed Ctrl-C, and ``on_part`` for finished parts (None: not wanted)."""

    def __init__(self, bars: Bars) -> None:
        self.bars = bars
        self.on_part: Callable[[Any], None] | None = None

    def __call__(self, label: str, total: int) -> Callable[[int], None]:
        advance = self.bars(label, total)

        def step(n: int) -> None:
            # A Ctrl-C whose KeyboardInterrupt Python swallowed (raised inside a finaliser or a
            # callback that ignores exceptions) still stops the run at the next batch.
            if INTERRUPTED:
                raise KeyboardInterrupt
            advance(n)

        return step

    def paused(self) -> contextlib.AbstractContextManager[None]:
        return self.bars.paused()


@contextlib.contextmanager
def checked_bars(console: Console) -> Iterator[CheckedBars]:
    with progress_bars(console) as bars:
        yield CheckedBars(bars)


class PrintedParts:
    """Prints a run's finished parts to ``console`` while it goes on; counts the sections it printed.
    From the first part whose tables the whole run decides (the IOI tables) on, it holds the rest."""

    def __init__(self, console: Console, top: int) -> None:
        self.console = console
        self.top = top
        self.sections = 0
        self.holding = False

    def show(self, part: Any, bars: CheckedBars) -> None:
        from headscope.outputs import report

        self.holding = self.holding or report.decided_by_whole_run(part)
        if self.holding:
            return
        with bars.paused():
            report.print_report(part, self.console, self.top)
            self.console.file.flush()
        self.sections += len(part.sections)


def profile_parts(timings: dict[str, float], run: float) -> dict[str, float]:
    """Wall seconds per part of a run: the timed steps, and "run" for the rest (all of it when
    the analysis has no steps), the names the cost ledger files forward passes under."""
    return {**timings, "run": run - sum(timings.values())}


def profile_line(loaded: float, costs: Sequence[Any], output: float) -> str:
    """``--profile``: seconds per step, each step's cost as a multiple of a bare forward over the
    tokens its passes ran (:mod:`headscope.capture.ledger`), and the total."""
    steps = [f"load {loaded:.1f} s"]
    several = len(costs) > 1
    for cost in costs:
        name = "other (checks, set-up)" if several and cost.part == "run" else cost.part
        text = f"{name} {cost.seconds:.1f} s"
        if cost.ratio is not None:
            text += f" ({cost.ratio:.2f}× bare, {cost.passes} passes)"
        steps.append(text)
    total = loaded + sum(cost.seconds for cost in costs) + output
    steps += [f"output {output:.1f} s", f"total {total:.1f} s"]
    return "profile: " + " · ".join(steps)


PROFILE_NOTE = (
    "profile note: × bare = the step's time over a bare forward (the base model with fused SDPA "
    "attention; with the LM head at every position where the step reads next-token losses, as "
    "model(...).logits runs it) of the tokens its passes ran, timed on one batch per length bucket and "
    "scaled by the token count; work besides those passes (patching, statistics) is in the step's time"
)
