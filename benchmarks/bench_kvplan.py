"""What does one ``kv-plan`` evaluation cost over a bare forward pass of the same prompts?

    python benchmarks/bench_kvplan.py --model smollm2-135m --needles 4 --json out.json

On the same needle prompts (``--context`` tokens, depths 0.1, 0.4, 0.7), in one process, after a
warm-up of each:

  (a) bare: the base model (SDPA attention, no LM head) on the prompt batches;
  (b) score: headscope's full-attention pass of ``kv-plan`` (streaming capture with the retrieval
      detector and the long-range mass, top-1 predictions and losses at the answer positions);
  (c) plan: one verification pass, half the candidate KV heads streaming (the per-KV-head sink +
      recent-window mask inside headscope's attention function), no detectors.

A whole ``kv-plan`` run is one (b) plus, per sparsity, one (c) for the plan and one per random
draw (and per other score with ``--compare``), plus the natural-text passes. Wall time is the best
of ``--repeats`` runs. Quote the ratios: these machines are noisy.
"""

from __future__ import annotations

import argparse
import json

from timing import bare, best_of

from headscope import capture
from headscope.analyses import kvplan
from headscope.data.circuits import load_haystack, load_retrieval
from headscope.data.prompts import builtin
from headscope.models import load


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--needles", type=int, default=4)
    parser.add_argument("--context", type=int, default=1280)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()

    loaded = load(args.model)
    needles = load_retrieval(builtin("retrieval/en.yaml"))
    needles.items = needles.items[: args.needles]
    haystack = load_haystack(builtin("retrieval/haystack-en.txt"))
    options = {
        "contexts": (args.context,),
        "depths": (0.1, 0.4, 0.7),
        "sink": kvplan.DEFAULT_SINK,
        "recent": kvplan.DEFAULT_RECENT,
        "method": "retrieval",
        "text_chunks": 1,
        "kv_dtype": "float32",
        "batch_size": 2,
        "n_resamples": 0,
        "seed": 0,
        "progress": None,
    }
    with capture.prepared(loaded):
        scored = kvplan.score(loaded, needles, haystack, haystack, **options)
        inputs = scored.inputs
        plan = scored.plan
        half = kvplan.n_streaming(0.5, len(plan.candidates))
        streaming = capture.StreamingHeads.of(plan.ranked[len(plan.ranked) - half :], plan.sink, plan.recent)
        times = {
            "bare": best_of(args.repeats, lambda: bare(loaded, inputs.needle_batches, lm_head=False)),
            "score": best_of(
                args.repeats, lambda: kvplan.score(loaded, needles, haystack, haystack, **options)
            ),
            "plan": best_of(
                args.repeats, lambda: kvplan.evaluate(loaded, inputs, streaming, None, "", text=False)
            ),
        }
    # score also runs the natural-text pass: time it alone and take it out for a like-for-like ratio.
    with capture.prepared(loaded):
        text = best_of(args.repeats, lambda: kvplan._text_loss(loaded, inputs, None))
    record = {
        "model": loaded.name,
        "prompts": len(inputs.prompts),
        "context": args.context,
        "seconds": times,
        "text_pass_seconds": text,
        "score_needles_over_bare": (times["score"] - text) / times["bare"],
        "plan_over_bare": times["plan"] / times["bare"],
    }
    print(json.dumps(record, indent=2))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2)


if __name__ == "__main__":
    main()
