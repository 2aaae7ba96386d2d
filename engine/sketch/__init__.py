"""Edit sketches: the formats a sketch is written in (`patches`: lazy, unified diff, SEARCH/REPLACE, V4A),
a chat answer's sketch (`chat_answer`), the merge by lines (`merge`, with `placement`, `anchors`, `edges`,
`blocks` and `line_index`), and the checks on every merge (`merge_checks`). A request's sketch is read
once into a `sketch.Sketch`, which the session makes; the merge's loops keep a `deadline.Deadline`. The
room sits above the records, whose requests and errors it reads."""
