"""Measuring the engine on this machine: `specedit bench` and `specedit calibrate` (`calibrate`).

`bench` runs every case (`cases`) under each method: ours and transformers' prompt lookup in this process
(`in_process`), llama.cpp (`llama_cpp`, `llama_server`), and the HTTP door (`openai_door`). One method's
run is a `method_run`; the records it writes are typed in `records`, summarised in `summary`, and a sketch
case's merges judged in `merges`."""
