"""The model layer: the model cache and provisioning the embedded models (`store`, `fetch`), the checks of
every file a load reads from the cache (`integrity`), loading a model and choosing its kernels (`loading`,
`invariant`, `exactness`), the one module that crops the KV cache (`kv_cache`), and the GPU's energy
counter (`energy`)."""
