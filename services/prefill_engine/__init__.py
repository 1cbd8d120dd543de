"""Prefill engine: computes a prompt's missing KV and hands the prompt to a decode engine."""
