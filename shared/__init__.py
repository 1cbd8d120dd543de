"""Code shared by the services: messages, bus, config, tracing, model, kv, transport."""
