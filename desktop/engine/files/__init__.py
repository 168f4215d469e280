"""Every reader of untrusted bytes: bounded file reads, the pickle scan and restricted unpicklers,
bounded JSON, tokenizer checks, finite weights, TensorBoard event files (their protobuf wire
format and CRC-32C)."""
