"""Hosts as Linux network namespaces on one machine: fabric, kernel-shaped links, faults, mesh placement."""
