"""Edit sketches: the formats a sketch is written in (`patches`: lazy, unified diff, SEARCH/REPLACE, V4A),
a chat answer's sketch (`chat_answer`), the merge by lines (`merge`, with `placement`, `anchors`, `edges`,
`blocks` and `line_index`), and the checks on every merge (`merge_checks`). It shares the lowest room
with the records: a request finds its sketch's format when it is made (`patches.detect`)."""
