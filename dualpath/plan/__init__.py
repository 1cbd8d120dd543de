"""The parallelism planner behind `dualpath plan`.

Pure calculation modules, one per question, returning frozen dataclasses (no torch, no argparse);
`table` and `views` render them, `cli` wires the argparse tree.
"""
