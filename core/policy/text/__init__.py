"""Text in and out of the model: tokenizers (byte, HF, GGUF), chat templates, the chat
format an episode is written in, and the tool-call formats a family's template expects."""
