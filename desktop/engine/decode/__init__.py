"""What every model family shares to decode: the protocols a model and tokenizer meet, the
generation loop, KV cache, sampling, scoring, attention and detokenizing."""
