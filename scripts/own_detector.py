"""Your own detector, three ways, on one hypothesis: "some heads attend from a closing bracket or
quote to the one that opened it". Run by scripts/docs.py for docs/extend.md (its output is
generated there, never pasted):

    python scripts/own_detector.py [MODEL]

1. hs.detect: the hypothesis as a TransformerLens-style pattern, a [T, T] matrix per prompt;
2. hs.TargetDetector: the same hypothesis as targets (query -> key pairs), registered, scanned
   beside the built-in previous-token detector, and checked by ablation;
3. the same declaration shipped in a plugin package (tests/plugins/headscope-brackets).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' "Loading weights" bar is not output

import torch

import headscope as hs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "plugins" / "headscope-brackets"))
import headscope_brackets as plugin  # noqa: E402  (the plugin's targets and prompts, imported as a module)

COLUMNS = ["layer", "head", "score", "baseline", "ci_low", "ci_high", "n", "role"]


def show(title: str, table, top: int = 5) -> None:
    print(f"\n{title}")
    print(
        table.sort_values("score", ascending=False)
        .head(top)[COLUMNS]
        .to_string(index=False, float_format="%.3f")
    )


def main(model: str = "smollm2-135m") -> None:
    loaded = hs.load(model)
    prompts = [line for line in plugin.PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    print(f"{loaded.name}: {len(prompts)} prompts with brackets and quotes ({plugin.PROMPTS.name})")

    # 1. A pattern: 1 at (closing token, its opening token), from each prompt's token ids.
    def bracket_pattern(ids: torch.Tensor) -> torch.Tensor:
        batch = _one_row(ids, loaded)
        rows, queries, keys = plugin.bracket_targets(batch)
        pattern = torch.zeros(len(ids), len(ids))
        pattern[queries, keys] = 1.0
        return pattern

    found = hs.detect(loaded, None, prompts, bracket_pattern, name="bracket-pattern", label="bpat")
    show("1. hs.detect(..., pattern=bracket_pattern), 'mul' as TransformerLens' detect_head:", found.table)
    print("   (mul divides by every row's attention, brackets or not: the scores are small by design)")

    # 2. The same hypothesis as targets, scanned beside previous-token and checked by ablation.
    hs.register(plugin.CLOSING_BRACKET)
    scanned = hs.scan(
        loaded,
        detectors="closing-bracket,previous-token",
        text=plugin.PROMPTS,
        weights=False,
        verify=True,
        verify_k=3,
    )
    table = scanned.table
    brackets = table[table.detector == "closing-bracket"]
    show("2. hs.TargetDetector('closing-bracket'), scanned (mass on the opening token):", brackets)
    previous = table[table.detector == "previous-token"].set_index(["layer", "head"]).score
    top = brackets.sort_values("score", ascending=False).head(5)
    same = ", ".join(
        f"L{r.layer}H{r['head']} {previous.loc[(r.layer, r['head'])]:.3f}" for _, r in top.iterrows()
    )
    print(f"   the same heads' previous-token scores: {same}")
    print(f"   heads with the role: {int((brackets.role == 'brkt').sum())} of {len(brackets)}")
    for check in scanned.checks:
        value = check.value
        if value.detector == "closing-bracket":
            heads = ", ".join(f"L{layer}H{head}" for layer, head in value.heads)
            print(
                f"   ablating {heads}: loss {value.clean:.3f} -> {value.topk:.3f} nats "
                f"({value.topk_effect:+.3f}); 3 random same-layer heads: {value.random_effect:+.3f}"
            )


def _one_row(ids: torch.Tensor, loaded) -> object:
    """A one-row batch of ``ids`` (the plugin's targets read token strings from a batch)."""
    from headscope.capture import make_batches

    (batch,) = make_batches(
        [ids.tolist()],
        [[False] * len(ids)],
        batch_size=1,
        pad_id=0,
        is_causal=loaded.is_causal,
        tokenizer=loaded.tokenizer,
    )
    return batch


if __name__ == "__main__":
    main(*sys.argv[1:])
