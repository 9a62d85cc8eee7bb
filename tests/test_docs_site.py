"""The built site in a real browser (issue 46): the home page and the interface's page,
built by mkdocs and served from 127.0.0.1, opened in headless Chromium: every picture
loads (complete, with a width) and the pages log no console error. Skipped, with the
reason, where mkdocs, Playwright or Chromium is missing (.ci/run installs them)."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("index.html", "interface/index.html")  # the home page, and the one with the pictures
# Chromium as root in a container, with no network to reach: no sandbox, no GPU, and none of
# its background connections (refused here, each a console error)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str | None:
    return os.environ.get("GRIDRUN_CHROMIUM") or shutil.which("chromium") or \
        shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "-f",
                            str(ROOT / "mkdocs.yml"), "-d", str(out)],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert built.returncode == 0, built.stderr
    handler = functools.partial(Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def browser():
    sync = pytest.importorskip("playwright.sync_api",
                               reason="Playwright is not installed (pip install -e '.[docs]')")
    path = chromium()
    if path is None:
        pytest.skip("no Chromium here (apt-get install chromium; or set GRIDRUN_CHROMIUM)")
    with sync.sync_playwright() as p:  # launch() gives Chromium a new, empty profile of its own
        browser = p.chromium.launch(executable_path=path, args=FLAGS)
        yield browser
        browser.close()


def visit(browser, origin: str, path: str) -> tuple[list[dict], list[str], list[str]]:
    """The page's pictures ({src, complete, width and height: natural; shown: on the
    page}), the errors the site itself logged, and the other hosts it asked for. Those
    are refused before they leave the machine (a test uses no network): the theme's web
    fonts and the repository's facts from GitHub, which a reader online gets and a
    reader offline goes without."""
    page = browser.new_page()
    errors: list[str] = []
    elsewhere: list[str] = []

    def route(r) -> None:
        if r.request.url.startswith(origin):
            r.continue_()
        else:
            elsewhere.append(r.request.url)
            r.abort()

    def console(m) -> None:
        if m.type == "error" and (m.location.get("url") or origin).startswith(origin):
            errors.append(f"{m.text} ({m.location.get('url')})")

    page.route("**/*", route)
    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"{r.url}: {r.failure}")
            if r.url.startswith(origin) else None)
    response = page.goto(origin + path, wait_until="load")
    assert response is not None and response.ok, f"{path}: {response and response.status}"
    page.wait_for_function("Array.from(document.images).every(i => i.complete)")
    images = page.evaluate("""Array.from(document.images).map(i => ({
        src: i.getAttribute('src'), complete: i.complete,
        width: i.naturalWidth, height: i.naturalHeight,
        shown: [Math.round(i.getBoundingClientRect().width),
                Math.round(i.getBoundingClientRect().height)]}))""")
    page.close()
    return images, errors, elsewhere


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_its_pictures_without_errors(browser, site, path):
    images, errors, _ = visit(browser, site, path)
    pictures = [i for i in images if "images/" in (i["src"] or "")]
    assert pictures, f"{path} shows no picture of the interface (docs/images/): {images}"
    broken = [i for i in images if not (i["complete"] and i["width"] > 0 and i["height"] > 0
                                        and min(i["shown"]) > 0)]
    assert not broken, f"{path}: pictures that did not load: {broken}"
    assert not errors, f"{path} logged errors: {errors}"


def test_a_missing_picture_and_a_script_error_are_caught(browser, tmp_path):
    """The check itself: a page whose picture is not there, and whose script throws."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "ok.svg").write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="8" '
        'height="8"/></svg>')
    (tmp_path / "index.html").write_text(
        '<!doctype html><title>t</title><img src="images/ok.svg"><img src="images/gone.svg">'
        "<script>undefined_name()</script>")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        images, errors, _ = visit(browser, f"http://127.0.0.1:{server.server_address[1]}/",
                                  "index.html")
    finally:
        server.shutdown()
        server.server_close()
    assert [(i["src"], i["width"] > 0) for i in images] == [("images/ok.svg", True),
                                                          ("images/gone.svg", False)]
    assert any("404" in e for e in errors) and any("undefined_name" in e for e in errors)
