"""The model the engines run: config, paged KV cache, Llama forward, loaders, tokenizer.

Import the submodules directly. `tokenizer`, `token_text`, `fetch` and `config` never import torch
(the CPU-only scheduler uses them); everything else does.
"""
