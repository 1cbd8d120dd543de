"""Traffic manager: one per engine; every byte into or out of the engine's KV memory moves through it."""
