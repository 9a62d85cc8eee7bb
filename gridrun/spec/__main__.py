"""`python -m gridrun.spec derive`: derive a run in a process that may import
its task (torch), for the interface, which never does.

Reads {"run": RunSpec.to_dict(), "overrides": "lr=0.01 hidden=128"} as JSON on
stdin; writes {"run": ...} (exit 0) or {"problems": [message, ...]} (exit 2).
"""

from __future__ import annotations

import json
import sys

from gridrun.spec import RunSpec, SpecError, derive


def main(argv: list[str]) -> int:
    if argv != ["derive"]:
        print(__doc__, file=sys.stderr)
        return 2
    request = json.load(sys.stdin)
    try:
        run = derive(RunSpec.from_dict(request["run"]), request["overrides"])
    except SpecError as e:
        print(json.dumps({"problems": [str(p) for p in e.problems]}))
        return 2
    print(json.dumps({"run": run.to_dict()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
