"""``python -m headscope.cli``: the same as the ``headscope`` command."""

from headscope.cli import main

main()
