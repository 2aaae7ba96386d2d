"""How long the README's first command takes to stream its first byte, with no daemon running.

    .venv/bin/python scripts/first_byte.py [--runs 7] [--json bench-results/first-byte.json] [-- ARGS...]

Runs `specedit rewrite examples/sample.py -i "Rename merge to merge_configs."` (or `specedit rewrite
ARGS...`; the `specedit` beside this Python) in process (`--engine inprocess`: a one-off rewrite loads the
model itself), once to write Python's bytecode and the kept files, then `--runs` times, one after
another, and times each from the start of the process to the first byte on its standard output. Python
may write its bytecode, as it does for users (`PYTHONDONTWRITEBYTECODE` is dropped from the environment).
Prints the median, the range, how many runs took under 2 s (issue 38's target), the machine's load and
its CPU class; steer the CPU class with the variables of docs/benchmarks.md. Run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = ["examples/sample.py", "-i", "Rename merge to merge_configs."]
TARGET_SECONDS = 2.0


def first_byte_seconds(command: list[str], env: dict[str, str]) -> float:
    """Seconds from starting `command` to the first byte on its stdout; the command runs to its end."""
    with tempfile.TemporaryFile() as stderr:  # (a pipe could fill while stdout is read)
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr)
        assert process.stdout is not None
        first = process.stdout.read(1)
        seconds = time.perf_counter() - started
        process.stdout.read()
        if process.wait() != 0 or not first:
            stderr.seek(0)
            said = stderr.read().decode(errors="replace").strip().splitlines()[-3:]
            raise SystemExit(f"first_byte: {' '.join(command)} failed (exit {process.returncode}): {' '.join(said)}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("args", nargs="*", help="after --: `specedit rewrite`'s arguments (default: the example)")
    options = parser.parse_args()
    specedit = Path(sys.executable).parent / "specedit"  # this Python's: .venv/bin/specedit
    command = [str(specedit), "rewrite", *(options.args or EXAMPLE), "--engine", "inprocess"]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}

    from specedit.engine.model.cpu import cpu_class
    from specedit.engine.model.exactness import KERNEL_ENV  # the variables that steer the kernels

    load_before = os.getloadavg()[0]
    first_byte_seconds(command, env)  # bytecode and kept files written; not counted
    times = [first_byte_seconds(command, env) for _ in range(options.runs)]
    load_after = os.getloadavg()[0]
    figures = {
        "median_seconds": round(statistics.median(times), 3),
        "range_seconds": [round(min(times), 3), round(max(times), 3)],
        "under_target": sum(seconds < TARGET_SECONDS for seconds in times),
        "runs": len(times),
        "seconds": [round(seconds, 3) for seconds in times],
        "load_average": [round(load_before, 2), round(load_after, 2)],
        "cpu_class": cpu_class(),
        "steered": {key: os.environ[key] for key in KERNEL_ENV if key in os.environ},
        "command": command[1:],
    }
    print(
        f"first byte: median {figures['median_seconds']:.2f} s ({min(times):.2f}-{max(times):.2f}), "
        f"{figures['under_target']} of {len(times)} under {TARGET_SECONDS:g} s; {figures['cpu_class']}"
        f"{' steered ' + str(figures['steered']) if figures['steered'] else ''}; "
        f"load {load_before:.2f} before, {load_after:.2f} after",
        file=sys.stderr,
    )
    if options.json:
        options.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
