"""The two halves stay apart: the interface never imports torch, the engine never Textual."""

import sys

import patience


def imported(code: str) -> set[str]:
    out = patience.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
                       capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_interface_never_imports_torch():
    mods = imported("import gridrun.tui.app, gridrun.tui.store_source, gridrun.commands.tui\n"
                    "from gridrun.tui.store_source import StoreSource")
    assert "textual" in mods
    assert "torch" not in mods
    assert "pandas" not in mods  # only the compare screen's worker pays for pandas


def test_nothing_outside_the_interface_imports_textual():
    # every module outside gridrun.tui (and the command that starts it), each really imported;
    # a module of an extra may miss that extra's packages (requests, urllib3: the mlflow
    # extra's HTTP layer, which the mirror's bounds wrap)
    mods = imported("import importlib, pathlib, gridrun\n"
                    "top = pathlib.Path(gridrun.__file__).parent\n"
                    "for f in sorted(top.rglob('*.py')):\n"
                    "    name = '.'.join(('gridrun',) + f.relative_to(top).with_suffix('').parts)\n"
                    "    name = name.removesuffix('.__init__')\n"
                    "    if name.startswith(('gridrun.tui', 'gridrun.commands', 'gridrun.cli'))"
                    " or name.endswith('__main__'): continue\n"
                    "    try: importlib.import_module(name)\n"
                    "    except ModuleNotFoundError as e:\n"
                    "        if e.name.split('.')[0] not in ('ray', 'submitit', 'onnx', 'onnxruntime',"
                    " 'onnxscript', 'pynvml', 'requests', 'urllib3'): raise")
    assert "gridrun.runs.store" in mods and "gridrun.train.loop.trainer" in mods
    assert "textual" not in mods
    assert not any(m.startswith("gridrun.tui") for m in mods)


def test_downsample_keeps_extremes():
    from gridrun.tui.widgets.curves import downsample

    points = [(i, float(i % 100)) for i in range(50_000)]
    points[12_345] = (12_345, 1e6)
    out = downsample(points, 80)
    assert len(out) <= 160
    assert (12_345, 1e6) in out
    assert downsample(points[:100], 80) == points[:100]
