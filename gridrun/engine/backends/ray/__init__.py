"""The Ray backend: `backend` (the engine's side: slots, launches, ends), `tasks`
(what runs on the nodes), `gangs` (a run on several devices: its placement group on
one node). The only package that imports ray."""

from gridrun.engine.backends.ray.backend import INSTALL_HINT, RayBackend, RayUnavailable

__all__ = ["INSTALL_HINT", "RayBackend", "RayUnavailable"]
