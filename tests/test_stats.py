"""A rewrite's stats: one typed value, the same dict at every boundary, and one record per step that the
governor, the stats and the step callback all read."""

from __future__ import annotations

import doctest
import json
from collections import Counter

import msgpack
import pytest

from specedit.drafters.copy_drafter import CopyDrafter
from specedit.engine.loop.governor import CostGovernor
from specedit.engine.loop.step import StepRecord
from specedit.engine.records import stats as stats_module
from specedit.engine.records.events import Done, Step, event_from_wire, event_to_wire
from specedit.engine.records.requests import RewriteOutcome
from specedit.engine.records.stats import DrafterStats, Stats
from specedit.engine.records.wire import ProtocolError, from_wire, to_wire

from conftest import tiny_engine

FULL = Stats(
    prompt_tokens=40,
    prefill_tokens=30,
    reused_tokens=9,
    generated_tokens=12,
    target_forwards=5,
    drafted_tokens=9,
    accepted_tokens=7,
    accepted_length_histogram=Counter({0: 1, 10: 1, 2: 3}),
    prefill_seconds=0.123456,
    first_text_seconds=0.2,
    decode_seconds=0.9,
    wall_seconds=1.023456,
    cpu_seconds=2.5,
    tokens_per_second=11.72529,
    decode_tokens_per_second=13.3333,
    joules=None,
    drafters={"copy": DrafterStats(3, 8, 7, 1), "context": DrafterStats(1, 1, 0, 0)},
    cost_probes=1,
    threads=2,
    exactness={"bitwise": True, "linear": "int8"},
    merge="model",
    merge_unresolved=("a chunk matched twice",),
    queue_seconds=0.25,
    steps_after_cancel=1,
    sketch_from="a chat answer: 1 fenced block",
    replica=4242,
)

# The dict every front end has shown, key for key and in this order (the wire, `--stats`, the language
# server's `stats`, the bench's JSON).
FULL_DICT = {
    "prompt_tokens": 40,
    "prefill_tokens": 30,
    "reused_tokens": 9,
    "generated_tokens": 12,
    "target_forwards": 5,
    "drafted_tokens": 9,
    "accepted_tokens": 7,
    "acceptance_rate": 0.7778,
    "mean_accepted_length": 1.4,
    "accepted_length_histogram": {"0": 1, "2": 3, "10": 1},
    "prefill_seconds": 0.1235,
    "first_text_seconds": 0.2,
    "decode_seconds": 0.9,
    "wall_seconds": 1.0235,
    "cpu_seconds": 2.5,
    "tokens_per_second": 11.73,
    "decode_tokens_per_second": 13.33,
    "joules": None,
    "drafters": {
        "context": {"proposals": 1, "drafted": 1, "accepted": 0, "wasted": 1, "held_back_steps": 0},
        "copy": {"proposals": 3, "drafted": 8, "accepted": 7, "wasted": 1, "held_back_steps": 1},
    },
    "cost_probes": 1,
    "threads": 2,
    "exactness": {"bitwise": True, "linear": "int8"},
    "merge": "model",
    "merge_unresolved": ["a chunk matched twice"],
    "queue_seconds": 0.25,
    "steps_after_cancel": 1,
    "sketch_from": "a chat answer: 1 fenced block",
    "replica": 4242,
}


def test_the_dict_holds_every_key_in_its_order() -> None:
    shown = FULL.to_dict()
    assert shown == FULL_DICT and list(shown) == list(FULL_DICT)
    assert list(shown["drafters"]) == ["context", "copy"]  # type: ignore[call-overload]
    assert list(Stats(wall_seconds=0.5, merge="lines").to_dict())[-1] == "merge"  # a merge by lines: no counters


def test_the_module_examples() -> None:
    assert doctest.testmod(stats_module).failed == 0


def test_a_rewrite_cancelled_before_it_ran_reports_only_what_was_measured() -> None:
    assert Stats.before_start().to_dict() == {}
    assert Stats.before_start(queue_seconds=0.5).to_dict() == {"queue_seconds": 0.5}
    waited = Stats.from_dict({"queue_seconds": 0.5, "steps_after_cancel": 0})
    assert not waited.ran and waited.queue_seconds == 0.5 and waited.steps_after_cancel == 0
    assert waited.to_dict() == {"queue_seconds": 0.5, "steps_after_cancel": 0}


@pytest.mark.parametrize("stats", [FULL, Stats(), Stats.before_start(queue_seconds=0.125), Stats(merge="lines")])
def test_an_outcome_crosses_the_wire_byte_for_byte(stats: Stats) -> None:
    outcome = RewriteOutcome("x = 1\n", "complete", "stop", stats)
    sent = event_to_wire(Done(outcome))
    assert sent["outcome"]["stats"] == stats.to_dict()  # type: ignore[index]
    frame = msgpack.packb(sent)
    received = event_from_wire(msgpack.unpackb(frame))
    assert isinstance(received, Done) and received.outcome.stats.to_dict() == stats.to_dict()
    assert msgpack.packb(event_to_wire(received)) == frame  # the daemon's msgpack, byte for byte
    text = json.dumps(sent)
    assert json.dumps(event_to_wire(event_from_wire(json.loads(text)))) == text  # the cluster's JSON


@pytest.mark.parametrize(
    "stats",
    [
        {"prompt_tokens": 1},  # counters half there
        {**FULL_DICT, "generated_tokens": "12"},
        {**FULL_DICT, "threads": True},
        {**FULL_DICT, "merge": "by hand"},
        {**FULL_DICT, "drafters": {"copy": {"proposals": 1}}},
        {"queue_seconds": "soon"},
        [],
    ],
)
def test_stats_that_no_engine_wrote_are_a_bad_message(stats: object) -> None:
    outcome = {"text": "", "status": "cancelled", "finish_reason": None, "stats": stats, "problem": ""}
    with pytest.raises(ProtocolError) as raised:
        from_wire(RewriteOutcome, outcome)
    assert raised.value.code == "bad_message"


def test_to_wire_keeps_records_as_plain_data() -> None:
    step = Step(1, 10, 9, 4, 3, 4, 4, 3, 0.1)
    assert to_wire(step) == {
        "step": 1, "committed_length": 10, "cache_length": 9, "drafted": 4, "accepted": 3, "generated_tokens": 4,
        "drafted_total": 4, "accepted_total": 3, "seconds": 0.1,
    }  # fmt: skip


class RecordingGovernor(CostGovernor):
    def __init__(self) -> None:
        super().__init__()
        self.heard: list[StepRecord] = []

    def record(self, step: StepRecord) -> None:
        self.heard.append(step)
        super().record(step)


def test_one_record_a_step_reaches_the_governor_the_stats_and_the_callback() -> None:
    engine = tiny_engine("llama")
    prompt = list(range(5, 25))
    plain = engine.generate(prompt, max_new_tokens=40)
    governor = RecordingGovernor()
    source = [*plain.tokens[:15], 3, *plain.tokens[16:]]  # a copy that is wrong once
    drafter = governor.gate(CopyDrafter(source, output_start=len(prompt)), "copy", max_draft=16, cheap=True)
    steps: list[Step] = []
    speculative = engine.generate(prompt, max_new_tokens=40, drafter=drafter, governor=governor, on_step=steps.append)
    stats, heard = speculative.stats, governor.heard
    assert speculative.tokens == plain.tokens
    assert len(heard) == len(steps) == stats.target_forwards < 40
    assert [(r.drafted, r.accepted, r.position) for r in heard] == [
        (s.drafted, s.accepted, s.committed_length) for s in steps
    ]
    assert sum(r.drafted for r in heard) == stats.drafted_tokens == steps[-1].drafted_total > 0
    assert sum(r.accepted for r in heard) == stats.accepted_tokens == steps[-1].accepted_total
    assert sum(r.committed for r in heard) == stats.generated_tokens == 40
    assert stats.drafters["copy"].drafted == stats.drafted_tokens
    assert all(r.source == "copy" for r in heard if r.drafted)
    assert stats.tokens_per_second == pytest.approx(40 / stats.wall_seconds)
