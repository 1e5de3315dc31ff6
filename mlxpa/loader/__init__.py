"""``--model`` to a local MLX folder and a loaded model: resolution, GGUF conversion, the
model geometry probe and load-time refusals."""
