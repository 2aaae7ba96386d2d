"""The engine: one folder per room, and a module imports only from its own room and the rooms below it.

- `doors/`: the front ends beside the command line and the language server: the daemon's host, the HTTP
  door (`http/`), the Ray Serve replica, and `specedit bench` and `specedit calibrate` (`bench/`);
- `session/`: `Session(backend)`, the one way every front end runs a rewrite, and the rules it holds;
- `backends/`: where a rewrite runs: in this process, in a daemon (its client and wire), on a cluster;
- `loop/`: the speculative loop: generate, verify, the governor, and `rewrite` (prepare, then run);
- `model/`: the forward: the decoder, the KV cache, the kernels, integer weights, sampling, loading;
- `store/`: provisioning: the model cache, fetching models, the integrity checks, the kept files;
- `sketch/`: edit sketches (the formats, a chat answer's code, the merge by lines, the checks on every
  merge), read once per request into one `Sketch` value, which the session makes;
- `records/`, the lowest: what every room speaks (requests, events and their wire, options, prompts,
  errors; no torch: clients import these).

The drafters (`specedit.drafters`) sit between the loop and the model. `tests/test_architecture.py` keeps
the order.
"""
