"""Traffic manager: one per engine (its compute NIC); every byte into or out of the engine's KV memory moves through it."""
