"""Operations around the engine: provisioning models (`model_store`), `specedit bench` (`bench`, with
llama.cpp as a peer in `llama_cpp`) and `specedit calibrate` (`calibrate`)."""
