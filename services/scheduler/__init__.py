"""Request scheduler: HTTP front door, hit lookup, global queue, engine assignment."""
