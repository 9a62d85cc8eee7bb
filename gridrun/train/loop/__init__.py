"""The loop: `trainer.train(spec, run_dir)` and the collaborators it asks.

    trainer   train(): build -> resume -> steps -> the end, and how a run ends
    build     the build phase: seed, task, model, optimizer, precision, run length
    state     TrainState, its one host sync (read_pending), the resume phase and
              the Checkpointer (when to save)
    step      the micro-batches, forward and backward, the optimizer step
    meter     the log points and their train lines
    validate  evaluation, best.pt and early stopping
    probe     Probe, what watches a run as it trains (diverge.py's replay)
    combine   a step's micro-batches made one step on several devices, or summed
              invariantly (each gradient apart, added in micro-batch order)
    attempts  each start of the run (an attempt) and the fields deciding its bits: the
              threads a resumed run keeps, a change it cannot keep said everywhere
    memory    the run's memory budget (GRIDRUN_MEMORY_BUDGET): CUDA's cap, the check
              at each log point, OverBudget (no torch at import: the engine reads it)

The modules import downward only, type-only imports included: probe, memory, attempts <- build
<- state, combine <- step, meter, validate <- trainer (the top, which alone imports them
all; nothing imports it back). tests/test_import_graph.py holds them to it.

Imports the rest of `gridrun.train` (data, seeding, checkpoint, diagnostics, ...);
nothing of `gridrun.train` imports this package but `worker` and `diverge`, which
run the loop.
"""
