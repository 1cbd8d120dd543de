"""Control-plane messages (msgspec Structs), grouped by subject family.

On the wire: enums as their values, keys as raw bytes, a `code: ErrorCode` on every failure
a receiver acts on. New fields get defaults; existing field types never change.
"""
