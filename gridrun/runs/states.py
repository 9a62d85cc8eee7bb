"""Run states and the worker's exit codes: the vocabulary shared by the
trainer, the worker, the store, the scheduler and every reader."""

QUEUED = "queued"
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
DIVERGED = "diverged"
OOM = "oom"
CANCELLED = "cancelled"
INTERRUPTED = "interrupted"
# A search's trials (engine/search.py): paused at a rung until the rung's decision, never
# finished (it goes on or stops); stopped by the scheduler at a rung, its own ending,
# neither failed nor cancelled.
WAITING = "waiting"
STOPPED = "stopped"

ALL = (QUEUED, RUNNING, COMPLETED, FAILED, DIVERGED, OOM, CANCELLED, INTERRUPTED, WAITING, STOPPED)
FINISHED = (COMPLETED, FAILED, DIVERGED, OOM, CANCELLED, STOPPED)

# Exit codes of `python -m gridrun.train.worker` and `gridrun train`.
# 2 is left to usage errors (a bad file, a bad argument), as everywhere in the CLI.
EXIT_CODES = {COMPLETED: 0, FAILED: 1, DIVERGED: 3, OOM: 4, INTERRUPTED: 5, WAITING: 7}
# Interrupted because a write of its own failed for want of space: the run is paused
# (back to the queue, resumed from its last good checkpoint) and the engine waits for space.
EXIT_NO_SPACE = 6
# A multi-device run one of whose ranks died (train/ranks.py): like a process that died,
# it goes back to the queue and resumes from its last checkpoint.
EXIT_RANK_DIED = 8
STATUS_OF_EXIT = {**{code: status for status, code in EXIT_CODES.items()},
                  EXIT_NO_SPACE: INTERRUPTED}

# why `gridrun retry` leaves a run as it is, and what to do instead
NOT_RETRIED = {
    QUEUED: "it waits for a slot already",
    RUNNING: "it is training (`gridrun cancel` it first to start it over)",
    WAITING: "for its search's decision at its rung",
    COMPLETED: "it ended well; `gridrun retry` is for runs that failed, diverged, ran out of "
               "memory or were cancelled",
    STOPPED: "its search stopped it at a rung, a decision that stands; to train its values "
             "to the end, set them (its variant) as an experiment of their own",
}
