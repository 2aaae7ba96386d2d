"""Operations around the engine: `specedit bench` (`bench`, with llama.cpp as a peer in `llama_cpp`) and
`specedit calibrate` (`calibrate`)."""
