"""Model loading: what the engine learns about an mlx-lm model before it runs it."""
