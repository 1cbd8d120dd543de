"""The five services of the mesh; each is its own process (python -m services.<name>)."""
