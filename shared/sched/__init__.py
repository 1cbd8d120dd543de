"""Pure scheduling code shared by the scheduler service, the prefill engine and the simulator."""
