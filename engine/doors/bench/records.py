"""The bench's JSON, as types: a method's record on a case, a case's record, and a sketch case's merges.

`specedit bench` writes these (`--out`), its summary reads them, and `scripts/figures.py` turns the summary
into the README's and the docs' tables. A record read back from an older file may lack the keys marked so.
"""

from __future__ import annotations

from typing import TypeAlias, TypedDict


class MethodExtra(TypedDict, total=False):
    """What a method reports beyond the figures every method has."""

    lookup_tokens: int  # prompt lookup: the most tokens it proposes at once
    same_answer_as_ours: bool  # a llama.cpp method: whether it answered as our plain decoding did
    best_of: str  # llama-server: its fastest type of speculation on the case
    spec_type: str | None  # llama-server: its type of speculation (None: plain decoding)
    server_timings: dict[str, object]  # llama-server: its own timings, as it reports them
    accepted_prediction_tokens: int | None  # the HTTP door: its usage block's
    rejected_prediction_tokens: int | None
    completion_tokens: int | None


class _MethodRecord(TypedDict):
    wall_seconds: float
    cpu_seconds: float
    prefill_seconds: float
    decode_seconds: float
    target_forwards: int
    drafted_tokens: int
    accepted_tokens: int
    joules: float | None
    drafters: dict[str, dict[str, int]]  # per drafter: drafted, accepted, wasted, ...
    identical_to_plain: bool | None
    first_difference: int | None
    extra: MethodExtra
    generated_tokens: int
    tokens_per_second: float
    acceptance_rate: float | None


class MethodRecord(_MethodRecord, total=False):
    """One method on one case (`MethodRun.to_dict`)."""

    prefill_gops: float | None  # GOP/s of the prefill (our methods; None for the peers)
    decode_gops: float | None  # GOP/s of decoding: verified rows' products over its seconds


class _AnswerVerdict(TypedDict):
    exact: bool  # the real edit's `after`
    whitespace_only: bool
    check: str  # "ok", or what the checks before writing caught
    seconds: float


class AnswerVerdict(_AnswerVerdict, total=False):
    """How one answer to a sketch case fares (`merges.merge_record`)."""

    loses_code: bool
    writes_answer_lines: bool


# A sketch case's merges: "resolved_by_lines" (bool) and "unresolved" (the chunks the lines did not
# place), then a verdict per answer: "lines", each method's, "auto".
MergeRecord: TypeAlias = dict[str, AnswerVerdict | bool | list[str]]


class _CaseRecord(TypedDict):
    id: str
    prompt_tokens: int
    original_tokens: int
    methods: dict[str, MethodRecord]


class CaseRecord(_CaseRecord, total=False):
    """One case: every method's record, and a sketch case's merges."""

    merge: MergeRecord
