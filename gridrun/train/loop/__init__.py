"""The loop: `trainer.train(spec, run_dir)` and the collaborators it asks.

    trainer   train(): build -> resume -> steps -> the end, and how a run ends
    build     the build phase: seed, task, model, optimizer, precision, run length
    state     TrainState, the resume phase and the Checkpointer (when to save)
    step      the micro-batches, forward and backward, the optimizer step
    meter     the log points: the one host sync and the train lines
    validate  evaluation, best.pt and early stopping

Imports the rest of `gridrun.train` (data, seeding, checkpoint, diagnostics, ...);
nothing of `gridrun.train` imports this package but `worker` and `diverge`, which
run the loop.
"""
