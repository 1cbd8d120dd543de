"""Prefill engine: computes prompt KV (only the miss part when blocks are stored) and hands it to a decode engine."""
