"""From a finished run to a deployable model.

    model     load_run (a run folder -> config, summary, metrics, model) and export_model
    formats   ONNX, torch.export (.pt2) and TorchScript exporters; the Signature
    whole     the task's preprocess and the model as one module (--with-preprocess)
    static    fixed sizes, padding and cutting back (--static)
    parity    the exported model against PyTorch on validation batches
    describe  model.json
    predict   `gridrun predict`: an export folder served from model.json alone
    modeljson model.json read back and checked (predict)
    jsoninput a JSON input read into arrays, no Python object per number (predict)
    results   predict's outputs: top classes, decisions, strict JSON, written as made

Imports `gridrun.train`, `gridrun.runs`, `gridrun.spec` and `gridrun.tasks`;
`predict` (with `modeljson`, `jsoninput`, `results`) imports only `gridrun.userfiles` of gridrun
(NumPy, onnxruntime or torch, Pillow).
"""
