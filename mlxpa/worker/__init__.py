"""One engine step on MLX: model runner, paged KV cache, attention, sampling."""
