"""The background process: the daemon, the scheduler that gives queued runs
slots, telemetry, and the backends (local, ray, slurm) that launch each run.

    daemon     start, stop and the loop of the engine process
    scheduler  queued runs -> slots -> launches; exits -> run states
    placement  which queued runs start now and on which slots (gangs for devices > 1, queue order)
    endings    how a run's end becomes its state (retries, OOM, over budget, restarts,
               paused for space)
    promotion  successive halving decided in trial-index order (pure functions)
    search     a search's rung results and decisions kept in the store, then carried out
    diskspace  the "waiting for disk space" state: no launch, retry, resume by itself
    telemetry  GPU and CPU samples (NVML behind one module that never raises)
    foreign    others' processes on the GPUs: which GPUs are taken, and the lines that say so
    sampling   telemetry and the GPUs' processes, each sampled on its own clock
    packing    GPU memory: a run's shape and budget, each GPU's room (pure)
    ledger     the machine-wide record of what every engine commits on each GPU (fail closed)
    entries    other users' entries in it: bounded, cached, and which runs are verifiably theirs
    sharing    the engine's memory book: placing under the ledger's lock, its store state
    backends/  launch a run on a slot, stream its events, cancel it

Imports `gridrun.train` (the worker a backend runs), `gridrun.runs` and
`gridrun.spec`. Never Textual, never `gridrun.tui`.
"""
