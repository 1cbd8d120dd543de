"""What both engines share: KV memory in shared memory, the model thread, engine config."""
