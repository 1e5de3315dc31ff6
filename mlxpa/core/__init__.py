"""The pure-Python core: blocks, the radix tree, the KV cache manager, the scheduler. No mlx."""
