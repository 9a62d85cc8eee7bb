"""From a finished run to a deployable model.

    model    load_run (a run folder -> config, summary, metrics, model) and export_model
    formats  ONNX, torch.export (.pt2) and TorchScript exporters
    parity   the exported model against PyTorch on validation batches

Imports `gridrun.train`, `gridrun.runs`, `gridrun.spec` and `gridrun.tasks`.
"""
