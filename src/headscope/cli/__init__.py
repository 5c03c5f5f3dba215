"""The command line: a thin user of the Python API (:mod:`headscope.api`).

Options are declared once, as dataclass fields (:mod:`headscope.cli.params`), where the API they
feed lives: the analyses' with the analyses, ``show``'s in :mod:`headscope.outputs.views`, the
sweep's in :mod:`headscope.sweeps.options`, the load options in :mod:`headscope.models.options`. The
shared groups and errors are in :mod:`headscope.cli.common`, printing and writing in
:mod:`headscope.outputs.terminal`; each analysis' command is derived from the registry
(:mod:`headscope.cli.analyses`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from headscope import __version__
from headscope.outputs.terminal import out, run_program

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
    run_program(app)


if __name__ == "__main__":
    main()
