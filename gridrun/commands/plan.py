"""(not built yet)"""

import typer


def register(app: typer.Typer) -> None:
    pass
