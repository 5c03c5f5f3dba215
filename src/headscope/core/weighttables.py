"""The weights tables (detector "weights"): what each head's score means (the report's section
summaries), and the role each table names, by relation."""

from headscope.core.rolespec import RoleSpec

# The detector name of every table read from the weights alone.
DETECTOR = "weights"

SUMMARIES = {
    "copying": "the head's OV circuit ranks the token it reads among its top-k logits",
    "suppression": "the head's OV circuit ranks the token it reads among its bottom-k logits",
    "eigenvalue": "Σ Re λ / Σ |λ| of the OV circuit on the sampled tokens (+1 copies, −1 suppresses)",
    "successor": "the head's OV circuit maps an ordinal to the next one (Monday → Tuesday, 一 → 二)",
}

ROLES = {
    # No causal check is defined for copying and suppression.
    "copying": RoleSpec(
        "copy",
        "copying OV circuit (raises the token it reads)",
        "#37b24d",
        "green",
        data="the weights alone (OV circuit over sampled tokens)",
    ),
    "suppression": RoleSpec(
        "supp",
        "copy suppression (lowers the token it reads)",
        "#c92a2a",
        "red",
        data="the weights alone (OV circuit over sampled tokens)",
    ),
    # The eigenvalue score saturates on some models (see the README) and names no role.
    "eigenvalue": RoleSpec(
        "eigen",
        "OV eigenvalue copying score",
        data="the weights alone (OV circuit over sampled tokens)",
        kind="descriptive",
    ),
    "successor": RoleSpec(
        "succ",
        "successor (Monday → Tuesday, 一 → 二)",
        "#e8590c",
        "yellow",
        data="the weights alone (OV circuit on ordinal sequences)",
        verify="ordinal-continuation",
    ),
}
