"""`gridrun mirror mlflow`: a root's runs mirrored into MLflow with MLflow's own client.

    records  what a run becomes in MLflow: params, tags, metric points, files
    cursor   how far the mirror sent each run (ROOT/.mirror-mlflow.json, untrusted when read)
    uri      the tracking URI shown and kept without credentials; a local store's write rule
    bounds   MLflow's HTTP requests bounded: a deadline per whole request, a cap on an
             answer, no retry (the one module on MLflow's private HTTP layer)
    client   MLflow's client, so bounded, and what a failed request means, in one line
    mirror   the store's change feed folded and sent; MLflow's own state is the truth

Nothing here imports mlflow at import time; `records`, `cursor` and `uri` never do.
"""
