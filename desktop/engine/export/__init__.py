"""Bridges between families: a nanochat checkpoint written as a Hugging Face (transformers
NanoChat) folder."""
