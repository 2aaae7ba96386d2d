"""The model: loading a model and choosing its kernels (`loading`, `invariant`, `exactness`), specedit's
forward (`decoder`, `kernels`, `quantized`) and the torch-free one (`torchless`), the one module that
crops the KV cache (`kv_cache`), the prompts' shared caches (`prefix_cache`), sampling a token from the
logits (`sampling`), and the GPU's energy counter (`energy`). `protocols` says what the loop reads of a
model, its tokenizer and its cache. What loads read is provisioned below, in
`store/`."""
