"""`EngineOptions` read back from a daemon's config or info file: every value of its field's type."""

from __future__ import annotations

import pytest

from specedit.engine.records.options import EngineOptions


def test_options_come_back_from_their_dict() -> None:
    options = EngineOptions(model="m", threads=2, p_min=0.25, draft_layers="0-3")
    assert EngineOptions.from_dict(options.to_dict()) == options
    assert EngineOptions.from_dict({"p_min": 0}).p_min == 0  # a whole number is a float too


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"threads": "2"}, "wrong type: threads"),
        ({"threads": True}, "wrong type: threads"),
        ({"model": 3, "p_min": "high"}, "wrong type: model, p_min"),
        ({"speed": "fast"}, "unknown engine options: speed"),
        (["model"], "a map"),
    ],
)
def test_options_of_another_shape_are_a_clear_error(values: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        EngineOptions.from_dict(values)
