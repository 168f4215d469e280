"""The Chat screen: the conversation view, its messages, the input box and the history sidebar."""
