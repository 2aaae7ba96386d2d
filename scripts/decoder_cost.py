#!/usr/bin/env python3
"""specedit's own forward (`model/decoder.py`) against transformers' model class, on the same weights and
kernels, in one process and in turn: one forward of k tokens after a context, on transformers' class with
its `DynamicCache`, on the decoder with a `DynamicCache`, and on the decoder with its own `KVCache`
(medians of the repeats), and whether the three give the same logits bit for bit.

    .venv/bin/python scripts/decoder_cost.py [--model NAME] [--threads 2] [--repeats 9] [--contexts 300,1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from transformers import DynamicCache

from specedit.engine.backends.local import load_target
from specedit.engine.model import kv_cache
from specedit.engine.model.loading import DECODER_VARIABLE
from specedit.engine.records.options import EngineOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--sizes", default="1,4,16,64")
    parser.add_argument("--contexts", default="300,1000")
    args = parser.parse_args()
    options = EngineOptions(model=args.model, threads=args.threads)
    os.environ[DECODER_VARIABLE] = "transformers"
    theirs = load_target(options)
    del os.environ[DECODER_VARIABLE]
    ours = load_target(options)
    assert ours.exactness is not None
    print(f"load average {os.getloadavg()[0]:.2f}; {ours.exactness.describe()}")
    setups = {
        "transformers": (theirs, DynamicCache),
        "decoder+DynamicCache": (ours, DynamicCache),
        "decoder+KVCache": (ours, ours.new_cache),
    }
    ids = [(index * 7919 + 13) % int(ours.model.config.vocab_size) for index in range(4096)]
    print("context  tokens  " + "  ".join(f"{name:>20s}" for name in setups) + "  ratio  same")
    with torch.inference_mode():
        for context in (int(value) for value in args.contexts.split(",")):
            caches = {}
            for name, (loaded, make) in setups.items():
                caches[name] = make()
                loaded.forward(ids[:context], caches[name], logits_to_keep=1)
            for size in (int(value) for value in args.sizes.split(",")):
                times: dict[str, list[float]] = {name: [] for name in setups}
                logits = {}
                for _ in range(args.repeats):
                    for name, (loaded, _) in setups.items():
                        start = time.perf_counter()
                        logits[name] = loaded.forward(ids[context : context + size], caches[name])
                        times[name].append(time.perf_counter() - start)
                        kv_cache.rollback(caches[name], context)
                medians = {name: statistics.median(seconds) * 1000 for name, seconds in times.items()}
                same = all(torch.equal(rows, logits["transformers"]) for rows in logits.values())
                ratio = medians["transformers"] / medians["decoder+KVCache"]
                cells = "  ".join(f"{medians[name]:17.1f} ms" for name in setups)
                print(f"{context:7d} {size:7d}  {cells}  {ratio:5.2f}x  {'yes' if same else 'no'}")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
