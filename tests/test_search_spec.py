"""A search table: its Sobol points (torch's, scrambled with the seed), its trials'
values (deterministic, rounded as the run's config and id hold them), and its
problems in the file's usual one-line form with file:line."""

from __future__ import annotations

import pytest
import torch

from gridrun.spec import SpecError, load_runs
from gridrun.spec.search import rung_label, rungs
from gridrun.spec.sobol import MAX_DIMENSIONS, sobol

HEAD = '[experiments.tune]\ntask = "spirals"\n\n[experiments.tune.search]\n'
GOOD = HEAD + ('trials = 9\nparams.lr = { dist = "log_uniform", low = 1e-4, high = 1e-1 }\n'
               'params.hidden = { dist = "int_uniform", low = 8, high = 64 }\n'
               'params.optimizer = { dist = "choice", values = ["adamw", "sgd"] }\n')


def test_unscrambled_points_are_torchs():
    n = 128
    mine = sobol(n, MAX_DIMENSIONS)
    theirs = torch.quasirandom.SobolEngine(MAX_DIMENSIONS, scramble=False).draw(
        n, dtype=torch.float64).tolist()
    assert mine == theirs


def test_scrambled_points_stay_a_net_and_depend_on_the_seed():
    for seed in (0, 1, 2):
        points = sobol(64, 5, seed=seed)
        for d in range(5):
            # 64 points of a (t, m, s)-net: one in each of the 64 equal intervals of each axis
            assert sorted(int(p[d] * 64) for p in points) == list(range(64))
        for a, b in ((0, 1), (2, 3)):  # and in each 8 x 8 cell of a pair of axes (t = 0 here)
            assert len({(int(p[a] * 8), int(p[b] * 8)) for p in points}) == 64
    assert sobol(8, 3, seed=1) == sobol(8, 3, seed=1) != sobol(8, 3, seed=2)


def write(tmp_path, text: str):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("sampler", ["sobol", "random", "grid"])
def test_trial_values_are_deterministic_rounded_and_written_in_the_config(tmp_path, sampler):
    text = GOOD.replace("trials = 9\n", f'trials = 9\nsampler = "{sampler}"\n')
    if sampler == "grid":
        text = text.replace('{ dist = "log_uniform", low = 1e-4, high = 1e-1 }',
                            '{ dist = "choice", values = [1e-3, 1e-2] }')
    runs = load_runs(write(tmp_path, text))
    again = load_runs(write(tmp_path, text))
    assert [r.id for r in runs] == [r.id for r in again]
    assert [r.trial for r in runs] == list(range(9))
    assert len({r.id for r in runs}) == 9
    for r in runs:
        lr = r.trainer["lr"]
        assert float(f"{lr:.4g}") == lr and 1e-4 <= lr <= 1e-1
        assert isinstance(r.task_args["hidden"], int) and 8 <= r.task_args["hidden"] <= 64
        assert r.axes == {"lr": lr, "hidden": r.task_args["hidden"],
                          "optimizer": r.trainer["optimizer"]}
        assert r.variant.startswith(f"t{r.trial} ")
        assert r.pause_at is None and r.search["sampler"] == sampler


def test_random_trial_values_depend_on_the_seed_and_index_only(tmp_path):
    text = GOOD.replace("trials = 9\n", 'trials = 9\nsampler = "random"\nseed = 3\n')
    nine = load_runs(write(tmp_path, text))
    four = load_runs(write(tmp_path, text.replace("trials = 9", "trials = 4")))
    assert [r.axes for r in nine[:4]] == [r.axes for r in four]


def test_asha_trains_every_trial_under_the_full_budget(tmp_path):
    text = GOOD + ('scheduler = "asha"\nmetric = "accuracy"\nmin_epochs = 1\nmax_epochs = 9\n'
                   '\n[defaults]\nepochs = 2\nseeds = 2\n')
    runs = load_runs(write(tmp_path, text))
    assert len(runs) == 18
    assert {r.trainer["epochs"] for r in runs} == {9}
    assert {r.pause_at for r in runs} == {1}
    assert runs[0].search["eta"] == 3 and "mode" not in runs[0].search
    assert rungs(1, 9, 3) == [1, 3, 9] and rungs(1, 10, 3) == [1, 3, 9, 10]
    assert rungs(1, 9, 3, bracket=1) == [3, 9]
    assert rung_label(runs[0].search, 0, 3) == "r1 e3/9"
    # best.pt and a trial's best value follow the searched metric, unless the file says
    assert {r.trainer["early_stop_metric"] for r in runs} == {"accuracy"}
    own = text.replace("epochs = 2\n", 'epochs = 2\nearly_stop_metric = "loss"\n')
    assert {r.trainer["early_stop_metric"] for r in load_runs(write(tmp_path, own))} == {"loss"}


@pytest.mark.parametrize("body, line, words", [
    ('trials = 9\nparams.lr = { dist = "log_uniform", low = 1e-1, high = 1e-4 }\n', 6,
     "low (0.1) is above high (0.0001): swap them"),
    ('trials = 9\nparams.lr = { dist = "log_uniform", low = 0.0, high = 1e-1 }\n', 6,
     "must be above 0"),
    ('trials = 9\nparams.hidden = { dist = "int_log_uniform", low = -2, high = 8 }\n', 6,
     "must be above 0"),
    ('trials = 9\nparams.lr = { dist = "loguniform", low = 1e-4, high = 1e-1 }\n', 6,
     "did you mean 'log_uniform'?"),
    ('trials = 9\nparams.lrr = { dist = "uniform", low = 0.1, high = 0.2 }\n', 6,
     "unknown key 'lrr'"),
    ('trials = 0\nparams.lr = { dist = "uniform", low = 0.1, high = 0.2 }\n', 5,
     "search.trials: expected an integer >= 1"),
    ('trials = 9\nsampler = "grid"\nparams.lr = { dist = "uniform", low = 0.1, high = 0.2 }\n',
     6, "is continuous"),
    ('trials = 9\nsampler = "grid"\nparams.hidden = { dist = "choice", values = [8, 16] }\n',
     5, "more than the grid's 2 points"),
    ('trials = 9\nsampler = "qmc"\nparams.lr = { dist = "uniform", low = 0.1, high = 0.2 }\n',
     6, "search.sampler: expected one of"),
    ('trials = 9\nparams.lr = { dist = "uniform", low = 0.1, high = 0.2 }\nscheduler = "asha"\n'
     'metric = "accuracy"\nmin_epochs = 9\nmax_epochs = 3\n', 9,
     "min_epochs (9) is above max_epochs (3)"),
    ('trials = 9\nparams.lr = { dist = "uniform", low = 0.1, high = 0.2 }\nscheduler = "asha"\n'
     'metric = "accuracy"\nmax_epochs = 3\neta = 1\n', 10, "expected eta = an integer >= 2"),
    ('trials = 9\nparams.lr = { dist = "uniform", low = 0.1, high = 0.2 }\nscheduler = "asha"\n'
     'max_epochs = 3\n', 4, "expected metric ="),
    ('trials = 9\nparams.epochs = { dist = "int_uniform", low = 1, high = 3 }\n', 6,
     "'epochs' cannot be searched"),
    ('trials = 9\nparams.lr = { dist = "uniform", low = 0.1, high = 0.2 }\nmetric = "loss"\n', 7,
     "belongs to a scheduler"),
])
def test_bad_search_tables_get_one_line_with_file_and_line(tmp_path, body, line, words):
    path = write(tmp_path, HEAD + body)
    with pytest.raises(SpecError) as caught:
        load_runs(path)
    text = str(caught.value)
    assert f"{path}:{line}: [experiments.tune]" in text, text
    assert words in text, text
    assert len(text.splitlines()) == 1, text


def test_a_searched_key_set_by_the_grid_is_refused(tmp_path):
    text = HEAD.replace("\n\n[", '\ngrid = { lr = [0.1, 0.2] }\n\n[') + (
        'trials = 9\nparams.lr = { dist = "uniform", low = 0.1, high = 0.2 }\n')
    with pytest.raises(SpecError, match="both searched and set by the grid"):
        load_runs(write(tmp_path, text))


def test_asha_needs_an_evaluation_at_each_epoch_end(tmp_path):
    text = GOOD.replace('task = "spirals"\n', 'task = "spirals"\neval_every = 5\n') + (
        'scheduler = "asha"\nmetric = "accuracy"\nmax_epochs = 9\n')
    with pytest.raises(SpecError, match=r"s.toml:3: \[experiments.tune\] eval_every: must be 0"):
        load_runs(write(tmp_path, text))


def test_a_search_metric_the_task_lacks_is_one_line_at_check_time(tmp_path):
    from gridrun.checks.taskcheck import check_file

    text = GOOD.replace('trials = 9', 'trials = 2') + (
        'scheduler = "asha"\nmetric = "acuracy"\nmax_epochs = 3\n')
    path = write(tmp_path, text)
    report = check_file(path)
    assert [str(p) for p in report.problems] == [
        f"{path}:10: [experiments.tune] task 'spirals': search.metric 'acuracy' is not among its "
        "metrics 'loss', 'accuracy' (did you mean 'accuracy'?)"]
