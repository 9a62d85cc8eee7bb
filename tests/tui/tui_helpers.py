"""Helpers for the Pilot tests (no asyncio plugin: each test runs its own loop)."""

import asyncio
import functools


def aio(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


async def settle(pilot, ticks: int = 1) -> None:
    """Wait until the bridge has delivered `ticks` polls and the screen caught up."""
    app = pilot.app
    for _ in range(250):
        if app.ticks >= ticks:
            break
        await pilot.pause(0.02)
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


async def until(pilot, cond, tries: int = 250) -> None:
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError("condition never held")
