"""Model execution helpers used by the model runner."""
