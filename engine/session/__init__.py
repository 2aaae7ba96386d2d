"""The session (`session`): `Session(backend)`, the one way every front end runs a rewrite, and the rules
around the model it holds (a sketch read once and merged by its lines, the answer judged)."""
