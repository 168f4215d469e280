"""nanochat and its C++ fork: checkpoints of every era, their tokenizers, the one GPT that runs
them, and their backend."""
