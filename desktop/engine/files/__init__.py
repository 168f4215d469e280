"""Every reader of untrusted bytes: bounded file reads, the pickle scan and restricted unpicklers,
bounded JSON, tokenizer checks, finite weights."""
