"""KV-cache blocks: identity (chained hashes), Full Block format, allocators."""
