"""One line per weights table: what the score of each head means (the report's section summaries)."""

SUMMARIES = {
    "copying": "the head's OV circuit ranks the token it reads among its top-k logits",
    "suppression": "the head's OV circuit ranks the token it reads among its bottom-k logits",
    "eigenvalue": "Σ Re λ / Σ |λ| of the OV circuit on the sampled tokens (+1 copies, −1 suppresses)",
    "successor": "the head's OV circuit maps an ordinal to the next one (Monday → Tuesday, 一 → 二)",
}
