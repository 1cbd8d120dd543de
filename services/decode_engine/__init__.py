"""Decode engine: admits prompts whose KV arrived in its buffer and runs continuous batching."""
