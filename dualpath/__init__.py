"""dualpath: the tools around the mesh (CLI, launcher, planner, simulator, benchmark)."""
__version__ = "0.1.0"
