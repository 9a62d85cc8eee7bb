"""`gridrun` exits non-zero when the interface stops on an error (it used to exit 0
after a traceback)."""

from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.tui.app import GridrunApp


def test_an_app_that_stopped_on_an_error_exits_non_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(GridrunApp, "run", lambda self: setattr(self, "_return_code", 1))
    result = CliRunner().invoke(app, ["--root", str(tmp_path / "runs")])
    assert result.exit_code == 1


def test_a_clean_quit_exits_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(GridrunApp, "run", lambda self: setattr(self, "_return_code", 0))
    result = CliRunner().invoke(app, ["--root", str(tmp_path / "runs")])
    assert result.exit_code == 0
