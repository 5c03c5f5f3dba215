"""What do the circuit analyses cost over a bare forward pass of the same prompts?

    python benchmarks/bench_circuits.py --model smollm2-135m --json out.json

On the same prompts, in one process, after a warm-up of each:

  retrieval (needles at ``--context`` tokens):
    (a) bare: the full model (SDPA attention, LM head) on the prompt batches, no scoring;
    (b) headscope: the streaming capture with the retrieval detector, top-1 predictions at the
        answer positions and settling hits;
  ioi (the shipped English set):
    (a) bare: the full model on the clean prompts;
    (b) headscope pass 1: attention to IO/S1/S2, per-head DLA and the logit difference;
    (c) headscope with path patching: everything ``headscope ioi`` does (pass 1, then a corrupted
        pass, a clean pass that records the name movers' blocks, and one replay of each block per
        sender layer at END's query only).

Wall time is the best of ``--repeats`` runs. Quote the ratios: these machines are noisy.
"""

from __future__ import annotations

import argparse
import json

import torch
from timing import bare, best_of

from headscope.analyses.ioi import ioi
from headscope.analyses.retrieval import build_prompts, needle_batches, score_prompts
from headscope.data.circuits import load_haystack, load_ioi, load_retrieval
from headscope.data.prompts import builtin
from headscope.models import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--needles", type=int, default=6)
    parser.add_argument("--ioi-items", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    loaded = load(args.model)
    out: dict = {"model": loaded.name, "threads": torch.get_num_threads()}

    needles = load_retrieval(builtin("retrieval/en.yaml"))
    needles.items = needles.items[: args.needles]
    haystack = load_haystack(builtin("retrieval/haystack-en.txt"))
    prompts = build_prompts(loaded, needles, haystack, (args.context,), (0.25, 0.75))
    batches = needle_batches(loaded, prompts, 2)
    t_bare = best_of(args.repeats, lambda: bare(loaded, batches))
    t_head = best_of(
        args.repeats,
        lambda: score_prompts(
            loaded, prompts, len(needles.items), "bench", "bench", batch_size=2, n_resamples=0
        ),
    )
    out["retrieval"] = {
        "prompts": len(prompts),
        "mean_tokens": sum(len(p.ids) for p in prompts) / len(prompts),
        "bare_s": t_bare,
        "headscope_s": t_head,
        "ratio": t_head / t_bare,
    }
    print(json.dumps(out["retrieval"]))

    ioi_set = load_ioi(builtin("ioi/en.yaml"))
    ioi_set.items = ioi_set.items[: args.ioi_items]
    from headscope.analyses.ioi import _batches, encode_ioi

    clean, _, _ = encode_ioi(loaded, ioi_set)
    order = sorted(range(len(clean)), key=lambda i: len(clean[i].ids))
    groups = [order[i : i + 8] for i in range(0, len(order), 8)]
    ioi_batches = _batches(loaded, clean, groups)
    t_bare = best_of(args.repeats, lambda: bare(loaded, ioi_batches))
    t_pass = best_of(args.repeats, lambda: ioi(loaded, ioi_set, n_resamples=0, patch=False))
    # Roles (and so the name movers) need intervals: the patching run bootstraps, as the CLI does.
    t_patch = best_of(args.repeats, lambda: ioi(loaded, ioi_set, n_resamples=200, patch=True))
    out["ioi"] = {
        "prompts": len(clean),
        "bare_s": t_bare,
        "pass1_s": t_pass,
        "with_patching_s": t_patch,
        "pass1_ratio": t_pass / t_bare,
        "patching_ratio": t_patch / t_bare,
    }
    print(json.dumps(out["ioi"]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=2)


if __name__ == "__main__":
    main()
