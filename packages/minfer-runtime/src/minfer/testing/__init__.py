"""Helpers that write small, realistic GGUF files for tests: no downloads needed."""
