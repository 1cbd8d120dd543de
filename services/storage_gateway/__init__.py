"""Storage gateway: all storage I/O of one node (its storage NIC)."""
