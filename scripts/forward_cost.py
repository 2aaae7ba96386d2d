#!/usr/bin/env python3
"""The machine's forward cost curve: one target forward of k tokens on the kernels the self-check chose
(engine.exactness) and on the model as transformers runs it, side by side in one process (interleaved,
median of the repeats).

    .venv/bin/python scripts/forward_cost.py [--model NAME] [--dtype auto] [--weights auto] [--threads 2] [--repeats 5]

For each context length and forward size (1 token: plain decoding; more: verification) it prints the
median seconds of both and their ratio, and whether the logits of the forward's last row are the same.
Beside the checked kernels' time, what the forward computed a second (every row's logits kept, attention
apart) and its share of the machine's integer peak (`engine.model.peak`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from specedit.engine.doors.bench.bench import as_transformers_runs_it
from specedit.engine.loop.generate import Engine
from specedit.engine.model import kv_cache
from specedit.engine.model.loading import LoadedModel, load_model
from specedit.engine.model.peak import Peak, forward_ops, integer_peak
from specedit.engine.records.options import WEIGHTS_CHOICES
from specedit.engine.store.fetch import resolve_model


def timed_forward(loaded: LoadedModel, cache: DynamicCache, ids: list[int]) -> tuple[float, torch.Tensor]:
    """One forward over `ids` after the cache's context, which it leaves as it was."""
    keep = kv_cache.length(cache)
    start = time.perf_counter()
    logits = loaded.forward(ids, cache)
    seconds = time.perf_counter() - start
    kv_cache.rollback(cache, keep)
    return seconds, logits[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weights", default="auto", choices=WEIGHTS_CHOICES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--contexts", default="500,1500")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(resolve_model(args.model), dtype=args.dtype, weights=args.weights)
    engine = Engine(loaded)
    assert loaded.exactness is not None
    source = Path(__file__).resolve().parent.parent / "engine" / "loop" / "generate.py"
    ids = loaded.tokenizer.encode(source.read_text() * 4)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.model}, {loaded.dtype_name}, {args.threads} threads")
    print(loaded.exactness.describe())
    ops, peak = forward_ops(loaded.model), integer_peak(args.threads)
    ceiling = peak.ceiling(ops.verified_row_products()) if isinstance(peak, Peak) else None
    print(f"integer peak: {f'{peak.gops:.0f} GOPS ({peak.instructions})' if isinstance(peak, Peak) else peak}")
    print(f"{ops.per_verified_row:.3f} GOP a row; the ceiling of the model's weights: {ceiling or 0:.0f} GOPS")
    print("context  tokens   checked s  transformers s  ratio  same last row    GOPS  share")
    for context_length in (int(value) for value in args.contexts.split(",")):
        for size in (int(value) for value in args.sizes.split(",")):
            forward_ids = ids[context_length : context_length + size]
            invariant_times, stock_times = [], []
            with torch.inference_mode():
                cache = DynamicCache()  # transformers' own takes it, and so does specedit's (`model.decoder`)
                loaded.forward(ids[:context_length], cache, logits_to_keep=1)  # the same for both
                for _ in range(args.repeats):
                    seconds, invariant_row = timed_forward(loaded, cache, forward_ids)
                    invariant_times.append(seconds)
                    with as_transformers_runs_it(engine):
                        seconds, stock_row = timed_forward(loaded, cache, forward_ids)
                    stock_times.append(seconds)
            a, b = statistics.median(invariant_times), statistics.median(stock_times)
            same = torch.equal(invariant_row, stock_row)
            gops = size * ops.per_verified_row / a
            part = f"{gops / ceiling:6.0%}" if ceiling else "     -"
            print(
                f"{context_length:7d} {size:7d} {a:12.4f} {b:15.4f} {a / b:6.3f}  {'yes' if same else 'no ':13s}"
                f" {gops:7.0f} {part}"
            )
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
