"""The sources of randomness: each with its own seed (`vary`, pins) and the
switches (`shuffle`, `augmentation`, `dropout_layers`), observed in the data,
the weights and the dropout masks; default runs keep their ids and bits."""

from __future__ import annotations

import hashlib
import json
import textwrap

import pytest
import torch

from gridrun.runs import layout, records, states
from gridrun.spec import SpecError, load_runs, write_run_config
from gridrun.train.loop.trainer import Probe, train

SMALL = 'task = "shapes"\ntrain_size = 64\nval_size = 16\nbatch_size = 16\nepochs = 1\n'


def runs_of(tmp_path, body: str):
    path = tmp_path / "e.toml"
    path.write_text(textwrap.dedent(body))
    return load_runs(path)


class Watch(Probe):
    """The initial weights' hash, the batches of the first steps, and what each
    dropout module gave back in training (whether it changed its input)."""

    def __init__(self) -> None:
        self.weights = ""
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.dropout_changed: list[bool] = []
        self.masks: list[torch.Tensor] = []  # what each dropout module dropped

    def attach(self, model: torch.nn.Module) -> None:
        h = hashlib.sha256()
        for name, t in sorted(model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        self.weights = h.hexdigest()
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.register_forward_hook(self._saw)

    def _saw(self, module, inputs, output) -> None:
        if module.training:
            self.dropout_changed.append(not torch.equal(inputs[0], output))
            self.masks.append((output == 0) & (inputs[0] != 0))

    def before_step(self, step: int, batch) -> None:
        self.batches.append((batch[0].clone(), batch[1].clone()))


def trained(tmp_path, run, **kw) -> tuple[dict, Watch]:
    watch = Watch()
    folder = layout.make_private_dir(tmp_path / run.id)
    write_run_config(folder / layout.CONFIG, run)
    summary = train(run, folder, probe=watch, log=lambda s: None, **kw)
    assert summary["status"] == states.COMPLETED, summary.get("error")
    return summary, watch


def same_batches(a: Watch, b: Watch) -> bool:
    return all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
               for x, y in zip(a.batches, b.batches, strict=True))


@pytest.mark.parametrize("vary", ["order", "init"])
def test_five_runs_that_vary_one_source_differ_only_in_it(tmp_path, vary):
    runs = runs_of(tmp_path, f'[experiments.s]\n{SMALL}max_steps = 2\nseeds = 5\nvary = "{vary}"\n')
    assert len(runs) == 5 and len({r.id for r in runs}) == 5
    watched = [trained(tmp_path, r)[1] for r in runs]
    weights = {w.weights for w in watched}
    first, others = watched[0], watched[1:]
    if vary == "order":
        assert len(weights) == 1  # the same initial weights ...
        assert all(not same_batches(first, w) for w in others)  # ... and another data order
    else:
        assert len(weights) == 5  # other initial weights ...
        assert all(same_batches(first, w) for w in others)  # ... on the same batches


@pytest.mark.parametrize("vary", ["init", "model"])
def test_dropout_masks_are_the_model_sources_alone(tmp_path, vary):
    body = ('[experiments.m]\ntask = "spirals"\ntrain_size = 64\nval_size = 16\nbatch_size = 16\n'
            f'epochs = 1\nmax_steps = 2\ndropout = 0.5\nseeds = 2\nvary = "{vary}"\n')
    a, b = (trained(tmp_path, r)[1] for r in runs_of(tmp_path, body))
    same_masks = all(torch.equal(x, y) for x, y in zip(a.masks, b.masks, strict=True))
    assert a.masks and same_batches(a, b)
    if vary == "init":
        assert a.weights != b.weights and same_masks
    else:
        assert a.weights == b.weights and not same_masks


# ---- a default run is the run it was

def test_default_runs_keep_the_ids_they_had(tmp_path):
    """Ids computed on main before the sources had keys (c7e69c3)."""
    runs = runs_of(tmp_path, """
        [experiments.ids-shapes]
        task = "shapes"
        seeds = 2
        [experiments.ids-spirals]
        task = "spirals"
        epochs = 2
        grid = { lr = [1e-3, 3e-3] }
        """)
    assert [r.id for r in runs] == ["d5d5d6d081", "b4f12c54d6", "00dc7d40e8", "f4c63357b1"]
    assert all(r.variant in ("", "lr=0.001", "lr=0.003") for r in runs)


def test_a_default_run_draws_as_before(tmp_path):
    """One stream from the seed on: the factory's draws, then the model's, with no
    reseed between; the order and the batch streams from the run's seed."""
    from gridrun.tasks import resolve
    from gridrun.train.data import start_epoch
    from gridrun.train.loop.build import build, training_loader
    from gridrun.train.seeding import data_seed, seed_everything, stream_seed

    run = runs_of(tmp_path, f"[experiments.d]\n{SMALL}seeds = [7]\n")[0]
    summary: dict = {"warnings": []}
    setup = build(run, torch.device("cpu"), summary, Probe(), lambda m: None)
    after_build = torch.get_rng_state()
    seed_everything(7)
    resolve("shapes")(**run.task_args)
    assert torch.equal(after_build, torch.get_rng_state())
    assert summary["randomness"] == {"seeds": dict.fromkeys(("init", "order", "augment", "model"), 7),
                                     "separate": False, "switched_off": []}
    loader = training_loader(setup)
    start_epoch(loader, 7, 1, 0)
    keys = list(loader.sampler)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(data_seed(7, 1))).tolist()
    assert keys == [(stream_seed(7, 1, b), order[b * 16:(b + 1) * 16]) for b in range(4)]


# ---- the switches, recorded and observed

def test_augmentation_false_gives_the_images_as_drawn(tmp_path):
    run = runs_of(tmp_path, f"[experiments.a]\n{SMALL}max_steps = 3\naugmentation = false\n")[0]
    assert run.trainer["augmentation"] is False and "augmentation=false" in run.variant
    summary, watch = trained(tmp_path, run)
    assert summary["randomness"]["switched_off"] == ["augment"]
    saved = records.Summary.from_json(json.loads(json.dumps(summary, default=str)), strict=True)
    assert saved.randomness["switched_off"] == ["augment"]  # what summary.json keeps
    from gridrun.tasks.shapes import shapes

    images = shapes(**run.task_args).train_data.images.flatten(1)  # as drawn, never shifted
    for x, _ in watch.batches:
        assert (x.flatten(1)[:, None, :] == images[None]).all(-1).any(-1).all()
    # on (the default), most images of a batch are shifted or flipped
    default = runs_of(tmp_path, f"[experiments.b]\n{SMALL}max_steps = 1\n")[0]
    x = trained(tmp_path, default)[1].batches[0][0].flatten(1)
    assert (x[:, None, :] == images[None]).all(-1).any(-1).float().mean() < 0.5
    import gridrun.randomness

    assert gridrun.randomness.enabled("augment")  # the run's switch ended with the run


def test_dropout_layers_false_runs_dropout_as_the_identity(tmp_path):
    body = ('[experiments.d]\ntask = "spirals"\ntrain_size = 64\nval_size = 16\n'
            'batch_size = 16\nepochs = 1\nmax_steps = 2\ndropout = 0.5\n')
    on = trained(tmp_path, runs_of(tmp_path, body)[0])[1]
    assert on.dropout_changed and all(on.dropout_changed)  # each mask drops something
    run = runs_of(tmp_path, body + "dropout_layers = false\n")[0]
    assert run.trainer["dropout_layers"] is False and "dropout_layers=false" in run.variant
    summary, off = trained(tmp_path, run)
    assert off.dropout_changed and not any(off.dropout_changed)
    assert summary["randomness"]["switched_off"] == ["dropout"]
    assert not summary["warnings"]


def test_shuffle_false_trains_in_index_order_every_epoch(tmp_path):
    body = f"[experiments.s]\n{SMALL}augment = false\nshuffle = false\n".replace("epochs = 1", "epochs = 2")
    run = runs_of(tmp_path, body)[0]
    assert run.trainer["shuffle"] is False and "shuffle=false" in run.variant
    summary, watch = trained(tmp_path, run)
    from gridrun.tasks.shapes import shapes

    images = shapes(**run.task_args).train_data.images
    assert len(watch.batches) == 8
    for step, (x, y) in enumerate(watch.batches):
        b = step % 4
        assert torch.equal(x, images[b * 16:(b + 1) * 16])
        assert y.tolist() == [i % 4 for i in range(b * 16, (b + 1) * 16)]
    assert summary["randomness"]["switched_off"] == ["shuffle"]


def test_workers_are_told_the_switches_however_they_start(monkeypatch):
    """A worker started by spawn imports gridrun.randomness afresh: the batches it
    fetches set the run's switches first."""
    import gridrun.randomness as randomness
    from gridrun.train import data

    seen = []

    class Asks(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            seen.append(randomness.enabled("augment"))
            return torch.zeros(1)

    previous = randomness.configure(["augment"])
    try:
        fetch = data.SeededBatches(Asks(), None)
    finally:
        randomness.configure(previous)
    monkeypatch.setattr(data, "get_worker_info", lambda: object())  # as in a worker
    fetch[(123, [0, 1])]
    assert seen == [False, False]
    randomness.configure(previous)


# ---- the file: vary, pins, labels, and what is refused

def test_vary_pins_every_source_and_labels_the_cell(tmp_path):
    runs = runs_of(tmp_path, """
        [experiments.v]
        task = "spirals"
        seeds = [3, 8]
        grid = { vary = ["all", "model", ["order", "init"]] }
        """)
    pins = [{k: r.trainer[k] for k in ("seed_init", "seed_order", "seed_augment", "seed_model")}
            for r in runs]
    assert [r.variant for r in runs] == ["vary=all"] * 2 + ["vary=model fixed=3"] * 2 + [
        "vary=[init,order] fixed=3"] * 2
    assert pins[:2] == [dict.fromkeys(pins[0], "seed")] * 2
    assert pins[2:4] == [{"seed_init": 3, "seed_order": 3, "seed_augment": 3, "seed_model": s}
                         for s in (3, 8)]
    assert pins[5] == {"seed_init": 8, "seed_order": 8, "seed_augment": 3, "seed_model": 3}
    assert runs[4].trainer["vary"] == ["init", "order"]  # in the sources' own order
    assert len({r.id for r in runs}) == 6


def test_a_pinned_source_is_in_the_label_and_the_id(tmp_path):
    plain, pinned = runs_of(tmp_path, """
        [experiments.p]
        task = "spirals"
        seeds = [1]
        ablations.init3 = { seed_init = 3 }
        """)[:2]
    assert pinned.variant == "init3 seed_init=3" and pinned.id != plain.id
    from gridrun.spec import sources

    assert sources.seeds_of(pinned.trainer, 1) == {"init": 3, "order": 1, "augment": 1, "model": 1}
    assert sources.separated(pinned.trainer) and not sources.separated(plain.trainer)


@pytest.mark.parametrize(("line", "expected"), [
    ('vary = "orderr"', "vary: unknown source 'orderr' (did you mean 'order'?): the sources "
                        "are init, order, augment, model (or 'all' for every one)"),
    ('vary = ["init", "all"]', "'all' already names every source"),
    ("vary = 3", "expected a source name or an array of them"),
    ('seed_init = -1', 'seed_init: expected an integer >= 0, or "seed"'),
    ('vary = "init"\nseed_order = 2', "vary pins every source itself"),
    ("shuffle = 0", "shuffle: expected a boolean"),
])
def test_bad_sources_are_refused_in_the_files_words(tmp_path, line, expected):
    with pytest.raises(SpecError) as err:
        runs_of(tmp_path, f'[experiments.x]\ntask = "spirals"\n{line}\n')
    assert expected in str(err.value)


def test_the_name_of_a_switch_is_suggested(tmp_path):
    with pytest.raises(SpecError) as err:  # sort has no `augment` key of its own
        runs_of(tmp_path, '[experiments.x]\ntask = "sort"\naugment = false\n')
    assert "did you mean 'augmentation'?" in str(err.value)
    # shapes has: `augment` stays its task key, as before
    run = runs_of(tmp_path, '[experiments.y]\ntask = "shapes"\naugment = false\n')[0]
    assert run.task_args["augment"] is False and run.trainer["augmentation"] is True


def test_a_clone_pins_sources_but_never_varies_them(tmp_path):
    from gridrun.spec import derive

    run = runs_of(tmp_path, '[experiments.c]\ntask = "spirals"\nseeds = 3\nvary = "order"\n')[2]
    with pytest.raises(SpecError, match="'vary' cannot change in a clone"):
        derive(run, "vary=init")
    moved = derive(run, "seed=9")  # the varied source follows the seed, the others stay
    assert [moved.trainer[f"seed_{s}"] for s in ("init", "order", "augment", "model")] == [0, 9, 0, 0]
    pinned = derive(run, "seed_init=4")
    assert pinned.trainer["seed_init"] == 4 and pinned.id != run.id


def test_plan_check_notes_switches_that_change_nothing(tmp_path):
    from typer.testing import CliRunner

    from gridrun.cli import app

    path = tmp_path / "e.toml"
    path.write_text(textwrap.dedent("""
        [defaults]
        train_size = 64
        val_size = 16
        augmentation = false
        [experiments.blind]
        task = "spirals"
        [experiments.sees]
        task = "shapes"
        dropout_layers = false
        [experiments.still]
        task = "spirals"
        dropout_layers = false
        augmentation = true
        seeds = 2
        vary = "order"
        shuffle = false
        """))
    result = CliRunner().invoke(app, ["plan", "--check", str(path)])
    assert result.exit_code == 0, result.output  # notes never block
    notes = [line for line in result.stderr.splitlines() if "note:" in line]
    assert len(notes) == 3, notes
    assert "[experiments.blind] note: task 'spirals': augmentation = false changed nothing it " \
           "could see" in notes[0]
    assert "[experiments.sees] note: task 'shapes': dropout_layers = false changed nothing" in notes[1]
    assert "[experiments.still] note: task 'spirals': vary varies the order source of runs with " \
           "shuffle = false" in notes[2]


def test_the_docs_protocol_is_the_example_file(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "docs" / "determinism.md").read_text()
    assert "\ngridrun run examples/sources.toml && gridrun compare sources --by-source" in readme
    runs = load_runs(root / "examples" / "sources.toml")
    assert len(runs) == 25 and {r.task for r in runs} == {"shapes"}
    # the table's threads are the file's, not an environment variable the runs ignore
    assert {r.trainer["threads"] for r in runs} == {1} and "OMP_NUM_THREADS=1 gridrun" not in readme
    groups = {r.trainer["vary"] for r in runs}
    assert groups == {"init", "order", "augment", "model", "all"}
    block = readme.split("[experiments.order-only]", 1)[1].split("```", 1)[0]
    order_only = runs_of(tmp_path, "[experiments.order-only]" + block)
    assert len(order_only) == 5 and len({r.trainer["seed_init"] for r in order_only}) == 1


def test_a_run_with_sources_of_its_own_resumes_exactly_and_ignores_workers(tmp_path):
    """The model source's stream (seeded anew after the build) is in the checkpoint:
    stopped mid-epoch and resumed, a pinned run with dropout ends where an
    uninterrupted one does, and DataLoader workers change nothing."""
    from test_resume import metrics_without_timing

    body = ('[experiments.r]\ntask = "spirals"\ntrain_size = 128\nval_size = 32\nbatch_size = 16\n'
            'epochs = 2\nlog_every = 1\ndropout = 0.3\nseed_order = 4\nseed_augment = 9\n')
    whole = runs_of(tmp_path, body)[0]
    ends = {}
    for name, run, stops in (("whole", whole, None), ("stopped", whole, 5),
                             ("workers", whole.with_trainer(num_workers=1), None)):
        folder = layout.make_private_dir(tmp_path / name)
        write_run_config(folder / layout.CONFIG, run)
        if stops:
            calls = iter(range(1, 100))
            first = train(run, folder, log=lambda s: None,
                          should_stop=lambda calls=calls, stops=stops: next(calls) >= stops)
            assert first["status"] == states.INTERRUPTED and first["step"] == stops
        summary = train(run, folder, log=lambda s: None)
        assert summary["status"] == states.COMPLETED, summary.get("error")
        assert summary["randomness"]["separate"] is True
        ends[name] = (summary["weights_sha256"], metrics_without_timing(folder))
    assert ends["stopped"] == ends["whole"] == ends["workers"]
