"""Measuring the engine on this machine: `specedit bench` (`bench`, with its peers llama.cpp in
`llama_cpp` and `llama_server`, and the HTTP door in `openai_door`; one method's run is a `method_run`)
and `specedit calibrate` (`calibrate`)."""
