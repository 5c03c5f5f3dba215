"""The shipped data sets an analysis reads when the caller names none (names under ``configs/``, for
:func:`headscope.data.prompts.builtin`).

The scan reads them all; ``syntax`` and ``coref`` read the first of theirs. They live here, not in
one analysis, so that no analysis imports another for a file name.
"""

from __future__ import annotations

DEFAULT_TEXT_SET = "text/natural.yaml"

DEFAULT_TREEBANKS = ("syntax/en.conllu", "syntax/zh.conllu")

DEFAULT_COREF_SETS = ("coref/en.yaml", "coref/zh.yaml")
