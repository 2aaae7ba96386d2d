"""The engine, in four rooms around what every front end shares.

- `requests`, `options`, `prompts`, `errors`: what a rewrite asks for, reports and returns, how an engine
  is configured, the prompt, and the one error hierarchy (no torch: clients import these);
- `session`: where a rewrite runs, in this process or in a daemon: the one way every front end runs one;
- `model/`: loading a model and choosing its kernels, the KV cache, the energy counter;
- `loop/`: the speculative loop, its drafters and governor, and `rewrite` (prepare, then run);
- `serving/`: the daemon, its wire protocol and client;
- `ops/`: provisioning models, `specedit bench` and `specedit calibrate`.
"""
