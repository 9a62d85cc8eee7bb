"""`gridrun mirror mlflow`: a root's runs mirrored into MLflow with MLflow's own client.

    records  what a run becomes in MLflow: params, tags, metric points, files
    cursor   how far the mirror sent each run (ROOT/.mirror-mlflow.json)
    client   MLflow's client, made with a short timeout, and what its failures mean
    mirror   the store's change feed folded and sent; MLflow's own state is the truth

Nothing here imports mlflow at import time; `records` and `cursor` never do.
"""
