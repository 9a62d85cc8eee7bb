"""Finished and running runs turned into tables: no torch, no engine.

    frames    runs -> one row per run (from the store, or the folders)
    experiment_frame  one experiment's rows kept between refreshes
    ablation  tables over seeds: mean, std, CI, deltas with Welch's p
    bysource  the spread of each metric by source of randomness
    search    a search's leaderboard and its parameters' rank correlations with the metric
    tdist     Student's t, without scipy
    rowtable  plain rows that `gridrun compare` reads without pandas
    tables    the text of a table: table, csv, markdown, latex, json
    export    frames and metrics to files, atomically
    devices   a run's devices and reduce, and the GPUs its slot's name holds (every view's)
    runlist   `gridrun ls`'s lines
    tensorboard     runs' scalars as TensorBoard event files
    mlflow/         `gridrun mirror mlflow`: the runs sent into MLflow (its __init__ lists its modules)

Imports `gridrun.runs` and `gridrun.spec`; nothing here imports torch.
"""
