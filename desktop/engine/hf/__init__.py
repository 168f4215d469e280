"""Hugging Face safetensors folders (transformers NanoChat port, Llama) and export to them."""
