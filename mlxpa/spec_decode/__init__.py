"""Draft-free speculative decoding: proposers that guess a running request's next tokens from
text it (or an earlier finished request) already holds, so one forward verifies several
tokens. Pure Python: no mlx."""
