"""The Summary tab's table over the summaries runs really write: nested objects
(environment, parameters, divergence) and the fields of every kind."""

from gridrun.tui.widgets import summary


def test_a_summary_with_nested_objects_renders_as_text():
    # what a run writes since the diagnostics (issue 14): objects inside objects
    written = {
        "status": "completed", "metrics": {"loss": "lower", "accuracy": "higher"},
        "best": {"loss": 0.91, "accuracy": 0.47}, "parameters": {"total": 8707, "trainable": 8707},
        "environment": {"torch": "2.13.0+cpu", "cuda": None, "determinism": {"deterministic": True}},
        "divergence": {"step": 11, "module": "body.2", "phase": "forward", "op": None},
        "peak_memory_bytes": 270225408, "wall_time_s": 75.5, "warnings": ["a", "b"],
        "weird": {"x": [1, {"y": 2}], "z": object()},
    }
    text = summary.table(written).plain
    assert "loss ↓  accuracy ↑" in text
    assert "total 8,707" in text and "torch 2.13.0+cpu" in text and "deterministic" in text
    assert "module body.2" in text and "257.7 MiB" in text and "1m 16s" in text
