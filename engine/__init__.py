"""The engine: model loading, the KV cache and its rollback, `verify`, the speculative loop, prompts, stats."""
