"""Models served over the OpenAI-compatible HTTP API (vLLM, SGLang, llama-server, transformers serve)."""
