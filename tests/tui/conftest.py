import pytest

from gridrun.tui import demo
from gridrun.tui.app import GridrunApp


@pytest.fixture
def make_app():
    def make(n: int = 24, *, gpus: bool = True, source=None):
        src = source or demo.source(n, gpus=gpus)
        return GridrunApp(src, clock=lambda: demo.NOW, live=False), src
    return make

