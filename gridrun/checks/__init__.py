"""Audits of runs, tasks and roots.

    verify     replay a run and compare it bit for bit with what it recorded
    verdict    RUN_DIR/verify.json, its one writer and reader (no torch)
    taskcheck  a task factory tried once before anything is queued
    metriccheck  the metric names a file gives (early_stop_metric, a search's) against the task's
    switchcheck  randomness switches a task ignores (`plan --check` notes)
    repro      a run as a standalone script that prints its first losses
    doctor     the root, the store, the disk, the engine and the machine checked
    rebuild    the queue rebuilt from the run folders (`doctor --rebuild`), never over a sound store

May import every package below it (engine, train, runs, spec, tasks).
"""
