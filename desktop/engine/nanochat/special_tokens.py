"""nanochat's special token names, shared by both tokenizer kinds and chat rendering.

See docs/ARCHITECTURE.md, Eras: Tokenizers.
"""

# nanochat's SPECIAL_TOKENS, in order; their ids are the last nine of the vocabulary.
BOS = "<|bos|>"
USER_START = "<|user_start|>"
USER_END = "<|user_end|>"
ASSISTANT_START = "<|assistant_start|>"
ASSISTANT_END = "<|assistant_end|>"
PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"
OUTPUT_START = "<|output_start|>"
OUTPUT_END = "<|output_end|>"
# What chat rendering cannot do without (docs/ARCHITECTURE.md, Eras: Loading).
CHAT_TOKENS = (USER_START, ASSISTANT_START, ASSISTANT_END)
# nanochat's SPECIAL_TOKENS in their (never changed) order: they take the last nine ids.
SPECIAL_TOKENS = (
    BOS,
    USER_START,
    USER_END,
    ASSISTANT_START,
    ASSISTANT_END,
    PYTHON_START,
    PYTHON_END,
    OUTPUT_START,
    OUTPUT_END,
)
