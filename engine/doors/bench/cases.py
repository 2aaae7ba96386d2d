"""The bench's cases: an edit each, by instruction or by edit sketch, read from a JSON Lines file.

A case holds the file before the edit and either an instruction or a sketch with the merge it should give
(`scripts/sketch_cases.py` makes them from real edits); `BenchCase.request` is what every method answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from specedit.engine.records.requests import RewriteRequest
from specedit.engine.sketch.chat_answer import sketch_from_answer


class _CaseLine(TypedDict):
    id: str
    before: str


class CaseLine(_CaseLine, total=False):
    """A line of a cases file: an instruction, or a sketch and the `after` it should give."""

    language: str
    instruction: str
    sketch: str
    after: str


@dataclass(frozen=True)
class BenchCase:
    """An edit: an instruction, or an edit sketch (`scripts/sketch_cases.py`) with the merge it should
    give (`after`)."""

    id: str
    language: str
    instruction: str | None
    before: str
    sketch: str | None = None
    after: str | None = None

    @classmethod
    def from_json(cls, record: CaseLine) -> BenchCase:
        sketch = record.get("sketch")
        return cls(
            record["id"],
            record.get("language", ""),
            None if sketch is not None else record["instruction"],
            record["before"],
            sketch,
            record.get("after") if sketch is not None else None,
        )

    def request(self, max_new_tokens: int | None) -> RewriteRequest:
        """The request every method answers; a sketch is merged by the model (its lines' merge is the
        draft), and the merge by lines alone is measured apart (`merge_record`)."""
        sketch = self.sketch
        if sketch is not None:  # a chat answer's code, as the session takes it (`chat_answer`)
            sketch = sketch_from_answer(sketch, self.before, language=self.language).sketch
        return RewriteRequest(
            self.before,
            self.instruction,
            sketch,
            language=self.language,
            max_new_tokens=max_new_tokens,
            merge="model",
        )


def load_cases(path: Path, *, limit: int | None = None, max_chars: int | None = None) -> list[BenchCase]:
    cases = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            case = BenchCase.from_json(json.loads(line))
            if max_chars is not None and len(case.before) >= max_chars:
                continue
            cases.append(case)
            if limit is not None and len(cases) >= limit:
                break
    return cases
