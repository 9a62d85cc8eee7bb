"""One run in one process: the training loop and everything it needs.

    loop/        train(spec, run_dir) and its phases: build, state, step, meter, validate
    data         the loaders and the per-batch random streams
    seeding      seeds, RNG states, deterministic mode
    checkpoint   atomic checkpoints that load with weights_only=True
    diagnostics  gradient norm, data wait, memory per log point
    levers       activation checkpointing, torch.compile
    switches     the randomness switches the trainer applies: dropout modules off
    optim        optimizer and learning-rate schedule
    threads      the CPU threads a run computes with: resolved, set, restored
    environment  the software and hardware a run ran on
    loader_probe num_workers = "auto": the loader timed, a setting chosen
    remedies     what an input-bound run should change, with its numbers
    diverge      where a NaN was born: a deterministic replay to the first bad op
    worker       the entry point a backend runs in a child process (and each extra rank)
    world        where a process stands among its run's devices (World), how ranks meet
    ranks        rank 0's children, ranks 1..n-1, and the watch that ends them all

Imports `gridrun.tasks`, `gridrun.spec` and the run-folder records of
`gridrun.runs` (layout, records, runlog, states); never the store, the engine
or anything above.
"""
