#!/usr/bin/env python3
"""What the engine's kernels cost in quality: the expected answers of a case set, teacher-forced, on the
kernels the engine runs and on the model as transformers runs it (the same weights: on int8 ones,
transformers' kernels get them dequantized and the activations in float32).

    .venv/bin/python scripts/answer_likelihood.py --cases bench-results/wholefile30.jsonl [--limit 30]
        [--model NAME] [--weights auto] [--threads 2]

For each, over every case's answer (its `after` and the closing fence, after the rewrite prompt): the
mean negative log-likelihood per token, how often the expected token is the argmax, and how often the
two argmaxes agree.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from specedit.engine.doors.bench.bench import as_transformers_runs_it
from specedit.engine.loop.generate import Engine
from specedit.engine.model.loading import load_model
from specedit.engine.records.options import WEIGHTS_CHOICES
from specedit.engine.records.prompts import RewritePrompt, build_prompt
from specedit.engine.store.fetch import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True)
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--weights", default="auto", choices=WEIGHTS_CHOICES)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(resolve_model(args.model), weights=args.weights)
    engine = Engine(loaded)
    assert loaded.exactness is not None
    with open(args.cases) as lines:
        cases = [json.loads(line) for line in lines][: args.limit]
    totals = {"engine": [0.0, 0], "transformers": [0.0, 0]}  # summed NLL, expected token the argmax
    agree = count = 0
    for case in cases:
        prompt = RewritePrompt(case["before"], case["instruction"], None, case["language"])
        text = build_prompt(loaded.tokenizer, prompt)
        answer = case["after"] + ("" if case["after"].endswith("\n") else "\n") + prompt.fence
        start = len(loaded.tokenizer.encode(text))
        ids = torch.tensor([loaded.tokenizer.encode(text + answer)])
        expected = ids[0, start:]
        logits = {}
        with torch.inference_mode():
            logits["engine"] = loaded.model(ids).logits[0, start - 1 : -1].float()
            with as_transformers_runs_it(engine):
                logits["transformers"] = loaded.model(ids).logits[0, start - 1 : -1].float()
        for name, rows in logits.items():
            totals[name][0] += torch.nn.functional.cross_entropy(rows, expected, reduction="sum").item()
            totals[name][1] += int((rows.argmax(-1) == expected).sum())
        agree += int((logits["engine"].argmax(-1) == logits["transformers"].argmax(-1)).sum())
        count += len(expected)
    print(f"{len(cases)} cases, {count} answer tokens; {loaded.exactness.describe()}")
    for name, (nll, hits) in totals.items():
        print(f"{name:12s} mean NLL {nll / count:.4f}  expected token the argmax {hits / count:.4f}")
    print(f"argmaxes agree {agree / count:.4f}; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
