"""The documentation's generated parts, made from the code, in one command:

    python scripts/docs.py references   # docs/reference/*.md from the spec and the CLI
    python scripts/docs.py pictures     # docs/images/*.svg from the real interface
    python scripts/docs.py all          # both

`--check` writes nothing and exits 1 if a committed file differs from what would be
written (the tests do the same: tests/test_docs_reference.py, tests/test_docs_pictures.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def generated(what: str) -> dict[str, Callable[[], str]]:
    """{path from the repository root: a function giving its text} for `what`."""
    out: dict[str, Callable[[], str]] = {}
    if what in ("references", "all"):
        import docs_reference

        out.update(docs_reference.PAGES)
    if what in ("pictures", "all"):
        import docs_pictures

        out.update(docs_pictures.pictures())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("references", "pictures", "all"))
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for rel, make in generated(args.what).items():
        path, text = ROOT / rel, make()
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(rel)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    verb = "differ from what the code gives" if args.check else "written"
    print(f"{len(stale)} {verb}" + "".join(f"\n  {p}" for p in stale))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
