"""The model the engines run: config, paged KV cache, decoders, loaders, tokenizer."""
