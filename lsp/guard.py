"""The guard on live rewrites: an answer that removes most of its region, on an instruction that asks for
no removal, is not written live. The server shows it as a preview instead and says what it removes.

A small model sometimes answers a rename with a stub, or "Add type hints" with one import line. Written
live, that overwrites the code before the user sees what happened. The rule, on the hunks settled so far:

- the region has at least `MIN_LINES` lines (a few lines are easy to review, and to undo);
- the hunks remove, net, more than `MAX_REMOVED_SHARE` of its lines;
- the instruction names no removal (`asks_to_remove`).

Where the figures come from (issue 67's cases, on the default model): "Rename append_msg to add_message."
left 4 lines of a 49-line function (45 removed, 92%); "Add type hints" left only `from typing import *`
(nearly 100%). A legitimate refactor that folds a loop into a comprehension removes a quarter to a third
of a function, and stays live: so the bound is a half. A refactor that dropped a loop of a long function
is below it, and is left to the user's review. Sketches are exempt: `engine.merge_checks` checks them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from specedit.lsp.hunks import Hunk, split_lines

MIN_LINES = 8
MAX_REMOVED_SHARE = 0.5

# Words that ask for code to go (their stems: "removes", "deleting", "simplify", "shorter" ...).
_REMOVAL = re.compile(
    r"\b(remov|delet|drop|strip|short|shrink|simplif|trim|clean|empt|clear|cut|eliminat|prun|condens|reduc|"
    r"minif|eras|purge|discard|omit|dedup|collaps|compact|consolidat|concise|stub|rid of|one[- ]liner)",
    re.IGNORECASE,
)


def asks_to_remove(instruction: str) -> bool:
    """The instruction names a removal, so a shorter answer is what was asked for.

    >>> asks_to_remove("Remove the debug prints."), asks_to_remove("Make it shorter")
    (True, True)
    >>> asks_to_remove("Rename append_msg to add_message."), asks_to_remove("Add type hints")
    (False, False)
    """
    return _REMOVAL.search(instruction) is not None


def removed_lines(hunks: Iterable[Hunk]) -> int:
    """Lines the hunks remove, net: old lines minus new lines (a rewrite of every line removes none).

    >>> removed_lines([Hunk(0, 0, 12, "a\\nb\\nc\\n", "x\\n"), Hunk(1, 20, 20, "", "y\\n")])
    1
    """
    return sum(len(split_lines(hunk.old_text)) - len(split_lines(hunk.new_text)) for hunk in hunks)


def too_destructive(instruction: str | None, removed: int, region_lines: int) -> str | None:
    """Why hunks that remove `removed` lines (net, `removed_lines`) of a region of `region_lines` lines
    must not be written live ("it removes 45 of 49 lines"), or None when they may be. `instruction` None
    (a sketch) is exempt.

    >>> too_destructive("Rename append_msg to add_message.", 45, 49)
    'it removes 45 of 49 lines'
    >>> too_destructive("Remove the function.", 45, 49) is None, too_destructive(None, 45, 49) is None
    (True, True)
    """
    if instruction is None or region_lines < MIN_LINES or asks_to_remove(instruction):
        return None
    if removed <= MAX_REMOVED_SHARE * region_lines:
        return None
    return f"it removes {removed} of {region_lines} lines"
