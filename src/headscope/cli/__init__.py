"""The command line: a thin user of the Python API (:mod:`headscope.api`).

Options are declared once, as dataclass fields (:mod:`headscope.cli.params`), where the API they
feed lives: the analyses' with the analyses, ``show``'s in :mod:`headscope.outputs.views`, the
sweep's in :mod:`headscope.sweeps.options`, the load options in :mod:`headscope.models.options`. The
shared groups and errors are in :mod:`headscope.cli.common`, printing and writing in
:mod:`headscope.outputs.terminal`; each analysis' command is derived from the registry
(:mod:`headscope.cli.analyses`).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from headscope import __version__
from headscope.outputs.terminal import BROKEN_PIPE_EXIT, is_devnull, out, quiet_broken_pipe

from . import analyses, tools  # noqa: F401  (registers the commands: the analyses', then the others)
from .common import app


def _version(value: bool) -> None:
    if value:
        out.print(f"headscope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """headscope: find out what every attention head in a transformer does."""


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "--debug" not in sys.argv:
        # The GGUF converter draws its own tqdm bar; tqdm reads this when it is imported.
        os.environ.setdefault("TQDM_DISABLE", "1")
    stdout_was_devnull = is_devnull(1)
    try:
        app()
    except BrokenPipeError:
        quiet_broken_pipe()
        sys.exit(BROKEN_PIPE_EXIT)
    except SystemExit as exc:
        # typer's own output (--help, usage) goes through a Rich console that, on a broken pipe,
        # points stdout at devnull and exits 1; give it the broken-pipe status as well.
        if exc.code == 1 and not stdout_was_devnull and is_devnull(1):
            sys.exit(BROKEN_PIPE_EXIT)
        raise


if __name__ == "__main__":
    main()
