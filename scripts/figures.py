#!/usr/bin/env python3
"""Renders the figures tables of README.md and docs/benchmarks.md from docs/figures.json.

    .venv/bin/python scripts/figures.py           # write the tables into both files
    .venv/bin/python scripts/figures.py --check   # exit 1 where a file differs from what the figures say

Each table lies between two markers, `<!-- figures:NAME -->` and `<!-- /figures:NAME -->`, and everything
between them is this script's: change a figure in docs/figures.json, never in the table. The README holds
the headline table (`headline`); docs/benchmarks.md holds the rest, one region a section of the JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "docs" / "figures.json"
README = REPO / "README.md"
BENCHMARKS = REPO / "docs" / "benchmarks.md"
MARKER = re.compile(r"<!-- figures:(?P<name>[a-z_]+) -->\n(?P<body>.*?)<!-- /figures:(?P=name) -->", re.DOTALL)
FOOTNOTE_MARKS = "¹²³⁴⁵⁶⁷⁸⁹"

Row = dict[str, Any]


class Figures:
    """docs/figures.json, read once, with the lookups every table needs."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.classes: dict[str, dict[str, Any]] = data["cpu_classes"]
        self.sets: dict[str, dict[str, Any]] = data["sets"]
        self.models: dict[str, str] = data["models"]
        for section in ("speed", "plain", "busy", "latency", "http_door", "merges", "answers"):
            for row in self.rows(section):
                if row["cpu"] not in self.classes:
                    raise SystemExit(f"figures: {section} names an unknown CPU class {row['cpu']!r}")
                if "set" in row and row["set"] not in self.sets:
                    raise SystemExit(f"figures: {section} names an unknown set {row['set']!r}")

    def rows(self, section: str) -> list[Row]:
        rows: list[Row] = self.data[section]["rows"]
        return rows

    def cpu(self, key: str) -> str:
        cpu = self.classes[key]
        return f"{cpu['label']} ({cpu['cpu']})"

    def set_label(self, row: Row) -> str:
        return str(self.sets[row["set"]]["label"])

    def model(self, row: Row) -> str:
        return self.models[row["model"]]


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def median_geomean(median: float | None, geomean: float | None) -> str:
    return ratio(median) if geomean is None else f"{ratio(median)} ({ratio(geomean)})"


def code(text: str | None) -> str:
    return f"`{text}`" if text else "-"


def count(value: int) -> str:
    return f"{value:,}"


def identical(row: Row, method: str = "specedit") -> str:
    rate = row["identical_rate"][method]
    return f"{round(rate * row['cases'])} of {row['cases']}"


class Notes:
    """Footnotes of one table: each distinct note gets a mark, in the order the rows name them."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, note: str | None) -> str:
        if not note:
            return ""
        if note not in self.texts:
            self.texts.append(note)
        return " " + FOOTNOTE_MARKS[self.texts.index(note)]

    def lines(self) -> list[str]:
        """Each note a paragraph of its own, after a blank line."""
        return [line for i, text in enumerate(self.texts) for line in ("", f"{FOOTNOTE_MARKS[i]} {text}")]


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def commands(rows: list[Row], *keys: str) -> list[str]:
    """The distinct commands of `rows`, in their order, as one shell block."""
    seen = [row[key] for row in rows for key in keys if row.get(key)]
    return ["", "```sh", *dict.fromkeys(seen), "```"]


def headline(figures: Figures) -> list[str]:
    """The README's table: one row a headline, one column a CPU class; then the notes, and the answers."""
    columns = list(figures.classes)
    notes = Notes()
    cells: dict[str, dict[str, str]] = {}

    def put(label: str, cpu: str, text: str) -> None:
        cells.setdefault(label, {})[cpu] = text

    speed = [row for row in figures.rows("speed") if row["readme"]]
    busy = [row for row in figures.rows("busy") if row["readme"]]
    for row in speed:
        label = f"{figures.set_label(row)}, {figures.model(row)}: over llama-server"
        slower = f"{row['slower_than_llama_server']} of {row['cases']} slower"
        put(label, row["cpu"], f"**{ratio(row['speedup_vs_llama_server'])}**, {slower}{notes.mark(row['note'])}")
    for row in busy:
        label = f"{figures.set_label(row)}, {figures.model(row)}, one core busy: over llama-server"
        busy_figures = row["busy"]
        slower = f"{busy_figures['slower_than_llama_server']} of {row['cases']} slower"
        text = f"**{ratio(busy_figures['speedup_vs_llama_server'])}**, {slower}{notes.mark(row['note'])}"
        put(label, row["cpu"], text)
    for row in figures.rows("latency"):
        if row["readme"]:
            detail = f" ({row['detail']})" if row["detail"] else ""
            put(row["short"], row["cpu"], f"**{row['seconds']:.2f} s**{detail}{notes.mark(row['note'])}")
    header = ["what", *(figures.cpu(cpu) for cpu in columns)]
    lines = table(header, [[label, *(by_cpu.get(cpu, "-") for cpu in columns)] for label, by_cpu in cells.items()])
    lines += notes.lines()
    total = sum(row["cases"] for row in speed + busy)
    same = sum(round(row["identical_rate"]["specedit"] * row["cases"]) for row in speed + busy)
    lines += ["", f"specedit's answer was identical to plain decoding in {count(same)} of these {count(total)} runs."]
    merges = [row for row in figures.rows("merges") if row["readme"]]
    if merges:
        lines += ["", "Fast apply needs no model where a sketch's lines say where each part goes."]
    for row in merges:
        losing = row["lines"]["let_through_losing_code"]
        losing_words = "none losing code" if losing == 0 else f"{count(losing)} losing code"
        exact = f"{count(row['lines']['exact'])} of {count(row['cases'])} {row['short']}"
        lines += [f"It merged {exact} exactly, {losing_words}."]
    return lines


def classes(figures: Figures) -> list[str]:
    rows = [
        [cpu["label"], cpu["cpu"], f"`{cpu['flags']}`", str(cpu["cores"]), cpu["kernels"]]
        for cpu in figures.classes.values()
    ]
    return table(["class", "CPU", "flags", "cores", "kernels and weights"], rows)


def sets(figures: Figures) -> list[str]:
    rows = [
        [entry["label"], code(entry["cases"]), entry["what"], code(entry["made_by"])] for entry in figures.sets.values()
    ]
    return table(["set", "`--cases`", "what", "made by"], rows)


def speed(figures: Figures) -> list[str]:
    notes = Notes()
    rows = []
    for row in figures.rows("speed"):
        cpu_seconds = row["cpu_seconds_per_token"]
        ours, theirs = cpu_seconds["specedit"], cpu_seconds["llama-server"]
        held = median_geomean(row["speedup_vs_llama_server_exact"], row["speedup_vs_llama_server_exact_geomean"])
        if row["slower_than_llama_server_exact"] is not None:
            held += f", {row['slower_than_llama_server_exact']} slower"
        rows.append(
            [
                figures.set_label(row) + notes.mark(row["note"]),
                figures.model(row),
                figures.classes[row["cpu"]]["label"],
                row["weights"],
                "**" + median_geomean(row["speedup_vs_llama_server"], row["speedup_vs_llama_server_geomean"]) + "**",
                f"{row['slower_than_llama_server']} of {row['cases']}",
                held,
                f"{ours:.3f} / {theirs:.3f}",
                ratio(ours / theirs),
                identical(row),
            ]
        )
    header = [
        "cases",
        "model",
        "CPU",
        "weights",
        "over llama-server",
        "slower",
        "held to its own answer",
        "CPU s a token, ours / its",
        "CPU time",
        "identical",
    ]
    return table(header, rows) + notes.lines() + commands(figures.rows("speed"), "command")


def plain(figures: Figures) -> list[str]:
    rows = []
    for row in figures.rows("plain"):
        rates = row["decode_tokens_per_second_median"]
        ours, theirs = rates["plain"], rates["llama-server-plain"]
        rows.append(
            [
                figures.set_label(row),
                figures.model(row),
                figures.classes[row["cpu"]]["label"],
                f"{ours:.1f} / {theirs:.1f}",
                ratio(ours / theirs),
            ]
        )
    header = ["cases", "model", "CPU", "tokens a second, ours / llama-server's", "our speed"]
    return table(header, rows)


def busy(figures: Figures) -> list[str]:
    notes = Notes()
    rows = []
    for row in figures.rows("busy"):
        idle, loaded, own = row["idle"], row["busy"], row["busy_over_idle_one_thread"]
        rows.append(
            [
                figures.cpu(row["cpu"]) + notes.mark(row["note"]),
                median_geomean(idle["speedup_vs_llama_server"], idle["speedup_vs_llama_server_geomean"]),
                "**"
                + median_geomean(loaded["speedup_vs_llama_server"], loaded["speedup_vs_llama_server_geomean"])
                + "**",
                f"{loaded['slower_than_llama_server']} of {row['cases']}",
                f"{ratio(own['median'])} ({ratio(own['min'])}-{ratio(own['max'])})",
                identical(row),
            ]
        )
    header = ["CPU", "idle: over llama-server", "one core busy", "slower", "busy / our idle one thread", "identical"]
    return table(header, rows) + notes.lines() + commands(figures.rows("busy"), "command", "command_one_thread")


def latency(figures: Figures) -> list[str]:
    notes = Notes()
    rows = []
    for row in figures.rows("latency"):
        if row["seconds"] is not None:
            figure = f"**{row['seconds']:.2f} s**"
            if row["low"] is not None:
                figure += f" ({row['low']:.2f}-{row['high']:.2f})"
        else:
            figure = f"**{row['low']:.1f}-{row['high']:.1f} s**"
        if row["detail"]:
            figure += f", {row['detail']}"
        rows.append([row["what"] + notes.mark(row["note"]), figures.cpu(row["cpu"]), figure, f"`{row['command']}`"])
    return table(["what", "CPU", "figure", "command"], rows) + notes.lines()


def http_door(figures: Figures) -> list[str]:
    notes = Notes()
    rows = []
    for row in figures.rows("http_door"):
        door = row["http_door"]
        rows.append(
            [
                figures.set_label(row) + notes.mark(row["note"]),
                figures.cpu(row["cpu"]),
                f"**{ratio(door['wall_ratio_median'])}**",
                f"{door['added_seconds_median']:+.3f} s",
                identical(row, "openai-prediction"),
            ]
        )
    header = ["cases", "CPU", "time beside `specedit`", "added a request", "identical"]
    return table(header, rows) + notes.lines() + commands(figures.rows("http_door"), "command")


def merges(figures: Figures) -> list[str]:
    rows = []
    for row in figures.rows("merges"):
        lines = row["lines"]
        rows.append(
            [
                figures.set_label(row),
                row["format"],
                count(row["resolved_by_lines"]),
                f"**{count(lines['exact'])}**",
                count(lines["whitespace_only"]),
                count(lines["let_through"]),
                f"**{count(lines['let_through_losing_code'])}**",
                count(row["cases"] - row["resolved_by_lines"]),
            ]
        )
    header = ["sketches", "format", "by lines", "exact", "whitespace only", "wrong", "losing code", "to the model"]
    return table(header, rows) + commands(figures.rows("merges"), "command")


def answers(figures: Figures) -> list[str]:
    notes = Notes()
    busy_note = "measured while other work ran on the machine: its times are longer than a quiet run's."
    rows = []
    for row in figures.rows("answers"):
        busy = notes.mark(busy_note if row["beside_other_work"] else None)
        rows.append(
            [
                figures.set_label(row),
                figures.model(row),
                f"**{row['exact'] + row['whitespace_only']} of {row['cases']}**",
                str(row["whitespace_only"]),
                f"{row['median_seconds']:.2f} s{busy}",
            ]
        )
    header = ["edits", "model", "the person's edit", "of them whitespace apart", "median time"]
    return table(header, rows) + notes.lines() + commands(figures.rows("answers"), "command")


RENDERERS: dict[str, Callable[[Figures], list[str]]] = {
    "headline": headline,
    "classes": classes,
    "sets": sets,
    "speed": speed,
    "plain": plain,
    "busy": busy,
    "latency": latency,
    "http_door": http_door,
    "merges": merges,
    "answers": answers,
}
REGIONS = {README: ("headline",), BENCHMARKS: tuple(name for name in RENDERERS if name != "headline")}


def load(path: Path = FIGURES) -> Figures:
    return Figures(json.loads(path.read_text(encoding="utf-8")))


def render(name: str, figures: Figures) -> str:
    return "\n".join(RENDERERS[name](figures)) + "\n"


def rendered(text: str, names: tuple[str, ...], figures: Figures) -> str:
    """`text` with every region in `names` rendered afresh; a region missing from `text` is an error."""
    found = {match["name"] for match in MARKER.finditer(text)}
    missing = [name for name in names if name not in found]
    if missing:
        raise SystemExit(f"figures: no region {', '.join(missing)} (add <!-- figures:NAME --> ... markers)")

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in names:
            raise SystemExit(f"figures: a region {name!r} this file should not hold")
        return f"<!-- figures:{name} -->\n{render(name, figures)}<!-- /figures:{name} -->"

    return MARKER.sub(replace, text)


def differences(figures: Figures | None = None) -> list[str]:
    """The files whose tables differ from what docs/figures.json renders (empty: all agree)."""
    figures = figures or load()
    return [
        str(path.relative_to(REPO))
        for path, names in REGIONS.items()
        if rendered(text := path.read_text(encoding="utf-8"), names, figures) != text
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table differs")
    options = parser.parse_args()
    figures = load()
    if options.check:
        stale = differences(figures)
        if stale:
            print(f"figures: out of date in {', '.join(stale)}: run scripts/figures.py", file=sys.stderr)
            raise SystemExit(1)
        return
    for path, names in REGIONS.items():
        text = path.read_text(encoding="utf-8")
        new = rendered(text, names, figures)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"figures: wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
