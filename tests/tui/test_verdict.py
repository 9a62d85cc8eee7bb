"""The run detail shows the last `gridrun verify` verdict (RUN_DIR/verify.json), and a
missing or garbage verify.json shows nothing and breaks nothing."""

import time

import pytest
from test_store_source import spec
from tui_helpers import aio, settle, until

from gridrun.checks import verdict
from gridrun.runs import layout
from gridrun.runs.store import Store
from gridrun.tui.app import GridrunApp
from gridrun.tui.screens.detail import DetailScreen
from gridrun.tui.source import Verdict
from gridrun.tui.store_source import StoreSource

WHEN = 1_796_300_000.0
IDENTICAL = {"ok": True, "steps": 186, "lines": 60, "weights": "identical", "weights_sha256": "ab" * 32,
             "difference": None, "when": WHEN}
DIFFERS = {"ok": False, "steps": 186, "lines": 60, "weights": "not compared", "when": WHEN,
           "difference": {"step": 40, "split": "train", "field": "loss", "recorded": 0.5,
                          "replayed": 0.5000000000000001}}
GARBAGE = ["{not json", "[1, 2]", '{"steps": 3}', '{"ok": false, "difference": 7}', ""]


def completed_run(root):
    s = spec(0)
    with Store(root) as store:
        store.enqueue([s])
        store.transition(s.id, "queued", "completed", summary={"status": "completed", "step": 186})
    return s.id, layout.make_private_dir(layout.run_dir(root, "exp", s.id))


def test_detail_reads_the_verdict(tmp_path):
    run_id, folder = completed_run(tmp_path)
    src = StoreSource(tmp_path)
    assert src.detail(run_id).verdict is None  # never verified
    verdict.write(folder, IDENTICAL)
    assert src.detail(run_id).verdict == Verdict(True, "bitwise identical over 186 steps", WHEN)
    verdict.write(folder, DIFFERS)
    assert src.detail(run_id).verdict == Verdict(False, "differs at step 40 loss", WHEN)


@pytest.mark.parametrize("text", GARBAGE)
def test_a_garbage_verify_json_is_no_verdict(tmp_path, text):
    run_id, folder = completed_run(tmp_path)
    (folder / layout.VERIFY).write_text(text)
    d = StoreSource(tmp_path).detail(run_id)
    assert d.verdict is None and d.summary["step"] == 186 and d.config["lr"] == 1e-3


@aio
async def test_the_detail_screen_shows_the_verdict_and_survives_garbage(tmp_path):
    run_id, folder = completed_run(tmp_path)
    verdict.write(folder, DIFFERS)
    app = GridrunApp(StoreSource(tmp_path), live=False)
    shown = f"verify: differs at step 40 loss ({time.strftime('%Y-%m-%d %H:%M', time.localtime(WHEN))})"
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        assert isinstance(app.screen, DetailScreen)

        def title() -> str:
            return str(app.screen.query_one("#title").render())

        await until(pilot, lambda: shown in title())
        assert shown in str(app.screen.query_one("#summary").render())
        verdict.write(folder, IDENTICAL)  # the screen reads its files again every second
        await until(pilot, lambda: "verify: bitwise identical over 186 steps" in title())
        (folder / layout.VERIFY).write_text("{garbage")
        await until(pilot, lambda: "verify" not in title())
        assert "verify" not in title() and run_id in title()
        assert str(app.screen.query_one("#summary").render()).startswith("status")
