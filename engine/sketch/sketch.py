"""One edit sketch, read once per request: the `Sketch` the session makes and every later step reads.

The session reads a request's sketch in one place (`Sketch.of`). It takes a chat answer's code out of
its prose and fences (`chat_answer`), finds the format in its text (`patches.detect`), parses a patch into
hunks, and merges the sketch by its lines (`merge`). The value then travels to the draft: the loop's
`prepare_rewrite` takes the partial merge as the copy drafter's source. It also travels to the judgement:
`session.judged` checks the model's answer with the format and hunks it holds (`Sketch.check`). The wire
carries the request's text, not this value, so a backend in another process reads the sketch once there.

>>> sketch = Sketch.read("x = 1\\ny = 2\\n", "# ... existing code ...\\ny = 3\\n")
>>> sketch.format, sketch.merge.text if sketch.merge else None
('lazy', 'x = 1\\ny = 3\\n')
>>> sketch.check("x = 1\\ny = 3\\n").ok
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from specedit.engine.records.requests import RewriteRequest, SketchFormat
from specedit.engine.sketch.chat_answer import AnswerSketch, sketch_from_answer
from specedit.engine.sketch.deadline import NO_DEADLINE, Deadline
from specedit.engine.sketch.merge import SketchMerge, merge_sketch
from specedit.engine.sketch.merge_checks import MergeCheck, check_merge
from specedit.engine.sketch.patches import Patch, WrittenFormat, detect, parse_patch


@dataclass(frozen=True)
class Sketch:
    """A request's sketch, read: the text to merge, how it is written, where it came from, and its merge
    by lines."""

    original: str = field(repr=False)  # the code the sketch edits, as the request has it
    text: str = field(repr=False)  # the sketch to merge: a chat answer's code, without its prose and fences
    format: WrittenFormat  # as the request names it, else as found in the text
    patch: Patch | None = field(default=None, repr=False)  # its hunks, for a sketch written as a patch
    chat_answer: AnswerSketch | None = None  # the chat answer it was taken out of (None: a bare sketch)
    merge: SketchMerge | None = field(default=None, repr=False)  # merged by its lines (None: not yet, `merged`)

    @classmethod
    def read(
        cls,
        original: str,
        text: str,
        sketch_format: SketchFormat = "auto",
        *,
        path: str | None = None,
        language: str = "",
        from_chat: bool = True,
        merge: bool = True,
        deadline: Deadline = NO_DEADLINE,
    ) -> Sketch:
        """`text` read as a sketch of `original`: a chat answer's code taken out (unless `from_chat` is
        False: the text is the sketch), its format found (`auto`) or as named, a patch parsed, and merged by
        its lines (unless `merge` is False: the merge is left to `merged`). `path` and `language` name the
        file, for a chat answer's code (`chat_answer.sketch_from_answer`, which raises `ChatAnswerError` for
        code of another file). The merge's loops check `deadline`."""
        answer = None
        if from_chat:
            taken = sketch_from_answer(text, original, path=path, language=language)
            if taken.blocks:
                text, answer = taken.sketch, taken
        deadline.check()
        # Found as the merge reads the texts, with newlines only.
        written_as = detect(_newlines(text), _newlines(original)) if sketch_format == "auto" else sketch_format
        patch = parse_patch(text, written_as) if written_as != "lazy" else None
        sketch = cls(original, text, written_as, patch, answer)
        return sketch.merged(deadline) if merge else sketch

    @classmethod
    def of(cls, request: RewriteRequest, *, merge: bool = True, deadline: Deadline = NO_DEADLINE) -> Sketch:
        """The request's sketch, read as the session reads it (`read`: a chat answer's code taken out)."""
        if request.sketch is None:
            raise ValueError("the request has no sketch: it gives an instruction")
        return cls.read(
            request.original,
            request.sketch,
            request.sketch_format,
            path=request.path,
            language=request.language,
            merge=merge,
            deadline=deadline,
        )

    def merged(self, deadline: Deadline = NO_DEADLINE) -> Sketch:
        """This sketch with its merge by lines done (itself, where it is done already)."""
        return self if self.merge is not None else dataclasses.replace(self, merge=self.by_lines(deadline))

    def by_lines(self, deadline: Deadline = NO_DEADLINE) -> SketchMerge:
        """Its merge by lines (`merge.merge_sketch`), as read, or made now where the reading left it out."""
        if self.merge is not None:
            return self.merge
        return merge_sketch(self.original, self.text, self.format, patch=self.patch, deadline=deadline)

    def asked(self, request: RewriteRequest) -> RewriteRequest:
        """`request` with this sketch's text as its sketch: what the model is shown (a chat answer's code
        alone, without its prose and fences)."""
        return request if request.sketch == self.text else dataclasses.replace(request, sketch=self.text)

    def check(self, answer: str) -> MergeCheck:
        """What keeps the model's `answer` from being a merge of this sketch into the original (nothing:
        `.ok`; `merge_checks.check_merge`, with the format and hunks read here). An answer that writes the
        chat answer's prose or fences is no merge either."""
        left_out = self.chat_answer.left_out if self.chat_answer is not None else ()
        return check_merge(self.original, self.text, answer, self.format, left_out=left_out, patch=self.patch)


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n")
