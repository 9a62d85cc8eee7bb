"""The experiment file: TOML -> validated ExperimentSpec -> one RunSpec per cell and seed.

Nothing here imports torch, so `gridrun plan` and the TUI stay fast; checking
task keys imports the task factory's module (and whatever that imports).

    errors.py    Problem, SpecError, where a problem is in the file
    sources.py   the sources of randomness: their seeds (vary, pins) and switches
    keys.py      the trainer keys, the aliases users type, the check of one value
    model.py     RunSpec, ExperimentSpec, EngineConfig, run ids, config.toml
    sobol.py     Sobol points in pure Python (Joe-Kuo directions), scrambled with a seed
    search.py    [experiments.NAME.search]: checked, its trials' values, its rungs
    validate.py  the file's tables checked, every problem collected
    engine_table.py  the [engine] table checked (local, ray and slurm keys)
    expand.py    an experiment -> its runs
    devices.py   each run's devices: divides accumulate, suits the backend, fits [engine]
    load.py      a file -> its runs and [engine] table (read once)
    derive.py    a run with keys changed (a clone), checked like a file

The modules import one another in that order only (a test walks the imports).
"""

from gridrun.spec.derive import derive, needs_task, parse_overrides
from gridrun.spec.errors import Problem, SpecError
from gridrun.spec.expand import count_runs, expand
from gridrun.spec.keys import KEY_ALIASES, TRAINER_KEYS, Key
from gridrun.spec.load import Loaded, load, load_engine_config, load_experiments, load_runs
from gridrun.spec.model import (
    EngineConfig,
    ExperimentSpec,
    RunSpec,
    format_value,
    parse_run_config,
    read_run_config,
    run_id,
    write_run_config,
)
from gridrun.spec.validate import DEFAULT_CAP, MAX_RUNS

__all__ = [
    "DEFAULT_CAP", "KEY_ALIASES", "MAX_RUNS", "TRAINER_KEYS", "EngineConfig", "ExperimentSpec",
    "Key", "Loaded", "Problem", "RunSpec", "SpecError", "count_runs", "derive", "expand",
    "format_value", "load", "load_engine_config", "load_experiments", "load_runs", "needs_task",
    "parse_overrides", "parse_run_config", "read_run_config", "run_id", "write_run_config",
]
