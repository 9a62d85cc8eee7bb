"""The records of runs, on disk and in SQLite: one owner per record kind.

    layout      a run folder's file names, the root's checks (one way to open a root), atomic writes
    nofollow    reading a run folder's files without following a link (readers)
    space       a full disk: how it is recognised (ENOSPC, SQLITE_FULL) and named
    records     the shape of every metrics line (names, the one parser)
    states      the run states
    runlog      metrics.jsonl: append, read, tail
    outputlog   output.log: the run's stdout and stderr, read safely
    progress    how far a run has got: one fold over its metrics lines
    rundirs     the run folders under a root, found from the disk alone
    store       the queue in SQLite (WAL): runs, intents, telemetry
    store_db    the SQLite file: opening, schema, what a failure means (damage, full, read-only)
    store_rows  the store's rows as Python values
    store_search  a search's tables: rung results and decisions (part of the Store)

Imports `gridrun.spec` (run specs) and nothing above it; no torch. Training
code (`gridrun.train`) may read and write the files here, never the store.
"""
