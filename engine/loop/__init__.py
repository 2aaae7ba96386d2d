"""The speculative loop: `generate` (draft, one target forward, `verify`, commit and roll back, feedback,
emit), each step's one record (`step`), the drafters a request gets (`drafting`) under the cost governor
(`governor`), and `rewrite`, which turns a `RewriteRequest` into a prompt, runs the loop and hands the code
back."""
