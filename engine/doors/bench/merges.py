"""How each answer to a sketch case fares: the merge by lines, each method's, and the product's choice.

An answer is exact (the real edit's `after`), differs in whitespace only, or is wrong: caught by the checks
before writing (`sketch.merge_checks`) or let through, and then worst when it loses code.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TypeGuard

from specedit.engine.doors.bench.cases import BenchCase
from specedit.engine.doors.bench.method_run import MethodRun
from specedit.engine.doors.bench.records import AnswerVerdict, CaseRecord, MergeRecord
from specedit.engine.doors.bench.summary import median
from specedit.engine.sketch.chat_answer import ChatAnswerError
from specedit.engine.sketch.merge import SketchMerge
from specedit.engine.sketch.merge_checks import counts, is_elision, is_fence
from specedit.engine.sketch.patches import SYNTAX
from specedit.engine.sketch.sketch import Sketch


def merge_record(case: BenchCase, runs: dict[str, MethodRun]) -> MergeRecord:
    """How each answer to a sketch case fares: the merge by lines (where it places every chunk), each
    method's (the model's), and `auto`'s (what the product answers: the lines' merge, else the model's
    through `specedit`): exact (the real edit's `after`), differing in whitespace only, or else caught by
    the checks before writing (`merge_checks`) or let through."""
    assert case.sketch is not None and case.after is not None
    started = time.perf_counter()
    try:  # read as the session reads it: a chat answer's code taken out, merged by its lines
        sketch = Sketch.read(case.before, case.sketch, language=case.language)
        lines = sketch.by_lines()
    except ChatAnswerError as error:  # code for another file: checked as the bare text, never merged
        sketch = Sketch.read(case.before, case.sketch, from_chat=False, merge=False)
        lines = SketchMerge(case.before, (str(error),))
    seconds = time.perf_counter() - started
    answers: dict[str, tuple[str, float]] = {m: (r.text, r.wall_seconds) for m, r in runs.items()}
    if lines.resolved:
        answers["lines"] = (lines.text, seconds)
    if lines.resolved or "specedit" in runs:
        answers["auto"] = answers["lines"] if lines.resolved else answers["specedit"]
    record: MergeRecord = {"resolved_by_lines": lines.resolved, "unresolved": list(lines.unresolved)}
    for name, (text, wall) in answers.items():
        check = sketch.check(text)
        record[name] = {
            "exact": text == case.after,
            "whitespace_only": text != case.after and text.split() == case.after.split(),
            "loses_code": _loses_code(case.before, case.after, text),
            "writes_answer_lines": _writes_answer_lines(case, text),
            "check": "ok" if check.ok else check.describe(),
            "seconds": round(wall, 4),
        }
    return record


def _loses_code(before: str, after: str, answer: str) -> bool:
    """Whether `answer` lacks a line of the original that the real edit kept (lines that say something,
    compared stripped, counted): the worst wrong merge, code deleted that nobody asked to delete."""

    def said(text: str) -> Counter[str]:
        return Counter(line.strip() for line in text.splitlines() if counts(line))

    return bool((said(before) & said(after)) - said(answer))


def _writes_answer_lines(case: BenchCase, answer: str) -> bool:
    """Whether `answer` holds a line of the case's sketch that neither the original nor the real edit has
    (a fence, or one that says something; no marker or patch syntax): a chat answer's prose or fence
    written into the file. Told from the case alone, whatever the extraction took."""
    assert case.sketch is not None and case.after is not None
    kept = {line.strip() for line in (case.before + "\n" + case.after).splitlines()}
    wrapping = {
        line.strip()
        for line in case.sketch.splitlines()
        if (counts(line) or is_fence(line)) and not is_elision(line) and not SYNTAX.match(line)
    } - kept
    return any(line.strip() in wrapping for line in answer.splitlines())


def summarise_merges(cases: list[CaseRecord]) -> dict[str, object]:
    """Per answer (`lines`, each method, `auto`): how many cases it answered, exact, whitespace only,
    caught by the checks, and wrong but let through; its median seconds; and for the cases the lines
    resolve, how fast `specedit` verifies their merge (tokens per target forward)."""
    names = sorted({name for c in cases for name, value in c["merge"].items() if isinstance(value, dict)})
    summary: dict[str, object] = {
        "cases": len(cases),
        "resolved_by_lines": sum(c["merge"]["resolved_by_lines"] is True for c in cases),
    }
    for name in names:
        verdicts = [v for c in cases if _is_verdict(v := c["merge"].get(name))]
        summary[name] = {
            "answered": len(verdicts),
            "exact": sum(v["exact"] for v in verdicts),
            "whitespace_only": sum(v["whitespace_only"] for v in verdicts),
            "caught": sum(v["check"] != "ok" for v in verdicts),
            "let_through": sum(v["check"] == "ok" and not v["exact"] and not v["whitespace_only"] for v in verdicts),
            "let_through_losing_code": sum(v["check"] == "ok" and v.get("loses_code", False) for v in verdicts),
            "writes_answer_lines": sum(v.get("writes_answer_lines", False) for v in verdicts),
            "median_seconds": median(v["seconds"] for v in verdicts),
        }
    resolved = [
        c["methods"]["specedit"] for c in cases if c["merge"]["resolved_by_lines"] and "specedit" in c["methods"]
    ]
    if resolved:
        summary["specedit_on_resolved"] = {
            "tokens_per_forward": median(r["generated_tokens"] / max(1, r["target_forwards"]) for r in resolved),
            "tokens_per_second": median(r["tokens_per_second"] for r in resolved),
        }
    return summary


def _is_verdict(value: AnswerVerdict | bool | list[str] | None) -> TypeGuard[AnswerVerdict]:
    return isinstance(value, dict)
