"""The parallelism planner behind `dualpath plan`.

Pure calculation modules, one per question (each returns frozen dataclasses and
imports neither torch nor argparse): `pd` (the P/D ratio window of
docs/concepts/design.md#the-pd-ratio-window), `attention` (attention TP x DP layouts), `moe` (MoE-TP vs MoE-EP),
`capacity` (usable HBM and B_memory), `cp` (context parallelism: Ring, Ulysses,
all-gather, DCP), `pp` (pipeline stage and chunk splits). `dtypes` maps dtype names
to bytes; `table` renders rows as text; `views` turns results into tables; `cli`
wires the argparse tree. Formulas and symbols follow docs/concepts/parallelism.md.
"""
