"""What one head role is, declared where the role is defined.

Each detector declares its roles' specs as class attributes in its own module (``detectors/``);
the roles read from the weights alone declare theirs in ``weightroles/summaries.py``. One lookup over
all of them, :func:`headscope.verdicts.roles.role_spec` (by table) and
:func:`headscope.verdicts.roles.spec_for_label` (by label), feeds the role rule, the role map,
the HTML legend, the sweep summary and ``scan --verify``.

This module imports nothing of headscope: ``detectors/`` and ``weightroles/`` are siblings of one
layer and may not import each other, so the record they both use sits in the leaf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["threshold", "signed", "descriptive"]

# A label nobody gave a colour or a style (a syntax relation outside the named ones).
PLAIN_COLOR = "#9aa5b1"
PLAIN_STYLE = "yellow"


@dataclass(frozen=True)
class RoleSpec:
    """The facts about one role of one table (data, detector, relation, direction).

    * ``label``: the short name in the role map, the CSV ``role`` column and the legends ("ind").
      A descriptive table's label only names the table (the sweep summary shows it).
    * ``meaning``: the legend's text for the label.
    * ``color``: its colour in the HTML report (hex); ``style``: its Rich style in the terminal role map.
    * ``data``: what the table reads ("repeated random tokens").
    * ``verify``: the causal check, or None where none is defined (``scan --verify`` says so in a
      note). Token-loss targets that ``scan --verify`` measures with the table's top heads ablated:
      "later-copies" (the later copies of the repeated random tokens), "text" (every token of the
      natural text), "dependents" (the relation's dependents' tokens), "pronouns" (the pronouns'
      tokens). Circuit measures, checked by their own analyses: "logit-difference" (IOI),
      "needle-accuracy" (retrieval), "ordinal-continuation" (successor).
    * ``kind``: how a head earns the role. "threshold": its score clears the reference (see
      ``RoleRule``); "signed": a score in its own units, tested against 0 both ways, ``label``
      above 0 and ``negative``'s label below; "descriptive": the table names no role.
    * ``negative``: for a signed score, the role below 0 (None: no role below 0).
    """

    label: str
    meaning: str
    color: str = PLAIN_COLOR
    style: str = PLAIN_STYLE
    data: str = ""
    verify: str | None = None
    kind: Kind = "threshold"
    negative: RoleSpec | None = None

    def labels(self) -> tuple[RoleSpec, ...]:
        """This spec and, for a signed score, the role below 0: every label the table can assign."""
        return (self,) if self.negative is None else (self, self.negative)
