"""`rr audit FILE --html OUT.html` opened in headless Chromium (Debian's package, driven by Playwright).

A real reflection (`scripted-audit`: cells, a child, a compaction, a sandbox host killed mid-session) on a
trace whose feedback is a `<script>` (it reaches the prefill's output and a model cell's output): the report
must show the timeline, a cell's code and output, a learning's link that opens and scrolls to its cell,
the unsupported citations marked, make no network request, and never run the trace's script.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import tests.support.audit_script as script
from reflector import client as rr
from reflector.client import connect
from reflector.client.audit.histories import collect, dump_bundle
from reflector.contract import ReflectionConfig
from reflector.runtime.settings import Settings
from tests.support import prefork
from tests.support.blob_dirs import EXTRA_BLOB_DIRS
from tests.support.fixtures import ACE_TRACE, write_trace
from tests.support.user_env import user_env

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"{CHROMIUM} is absent (Debian's `chromium` package: apt-get install -y chromium)",
    ),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the dev extra) is not installed")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPO_ROOT = Path(__file__).resolve().parents[2]
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


@pytest.fixture
def report(temporal_server, rr_home: Path, tmp_path: Path) -> tuple[Path, str]:
    """The HTML report of a finished reflection, written by the CLI from an exported file."""
    import asyncio

    from activities import sandbox as sandbox_activities
    from worker import build_worker

    async def reflect() -> tuple[str, str]:
        settings = Settings.from_env()
        EXTRA_BLOB_DIRS.append(settings.blob_dir)  # the suite's final replay reads this history's payloads
        client = await connect(temporal_server.address, settings=settings)
        tq = f"audit-html-{uuid.uuid4().hex[:6]}"
        trace = write_trace(tmp_path, {**ACE_TRACE, "feedback": HOSTILE})
        async with build_worker(client, tq):
            ref = rr.upload_trace(trace, settings)
            inp = rr.build_input(
                ref,
                question="What is 17 * 24?",
                ground_truth="408",
                config=ReflectionConfig(model=script.NAME, context_window=3_000, recursion="always"),
            )
            handle = await rr.start_reflection(client, inp, tq, f"audit-html-{uuid.uuid4().hex[:8]}")
            await handle.result()
            exported = dump_bundle(await collect(client, handle.id, settings.blob_dir))
        await sandbox_activities.shutdown()
        return handle.id, exported

    wf_id, exported = asyncio.run(reflect())
    export = tmp_path / "export.json"
    export.write_text(exported)
    out = tmp_path / "audit.html"
    env = user_env()
    env.update({"RR_HOME": str(tmp_path / "cli-home"), "RR_PLUGINS": "tests.support.audit_script"})
    p = prefork.run(
        [sys.executable, "-m", "reflector.cli", "audit", str(export), "--html", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and f"wrote the audit of {wf_id}" in p.stderr
    return out, wf_id


def test_html_report_in_headless_chromium(report: tuple[Path, str]) -> None:
    path, wf_id = report
    html = path.read_text()
    assert "<script>window.__pwned" not in html and "http://" not in html and "https://" not in html
    requests: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.on("request", lambda r: requests.append(r.url))
            page.goto(path.as_uri())
            _check_page(page, wf_id)
            # a link to a cell from outside (the URL's fragment) opens it too
            anchor = f"cell-{wf_id}-{script.ALPHA_CELL}"
            linked = browser.new_page()
            linked.on("request", lambda r: requests.append(r.url))
            linked.goto(path.as_uri() + "#" + anchor)
            assert linked.locator(f'details[id="{anchor}"]').evaluate("el => el.open")
        finally:
            browser.close()
    # self-contained: nothing but the file itself (twice: once per page)
    assert [url.split("#")[0] for url in requests] == [path.as_uri()] * 2, requests


def _check_page(page, wf_id: str) -> None:
    # the trace's script was shown as text, never run
    assert page.evaluate("window.__pwned === undefined")
    prefill = page.locator(f'details[id="cell-{wf_id}-1"]')
    prefill.locator("summary").click()
    assert "<script>window.__pwned = 1</script>" in prefill.locator("pre.output").inner_text()
    post = page.locator("details.cell", has=page.locator("pre.code", has_text="after the summary"))
    post.locator("summary").click()
    assert HOSTILE in post.locator("pre.output").inner_text()
    assert page.evaluate("window.__pwned === undefined")

    # the header and the timeline: requests, cells, the compaction, the child nested with its own cells
    assert page.locator("h1").inner_text() == f"Audit of {wf_id}"
    # alpha, recurse, three big cells (then the summary), the cell after it, the answer
    assert page.locator(f'[id="session-{wf_id}"] > .request').count() >= 7
    assert page.locator(".compaction").count() >= 1 and page.locator("svg.budget polyline").count() == 2
    child = page.locator(".child")
    assert child.count() == 1 and script.CHILD_PROMPT in child.locator("pre.prompt").inner_text()
    assert child.locator(".session details.cell").count() >= 2  # its prefill and its cell
    assert page.locator("details.cell .tag", has_text="rebuilt after a crash").count() == 1

    # a learning's link opens its (closed) cell and scrolls it into view; code and output are shown
    anchor = f"cell-{wf_id}-{script.ALPHA_CELL}"
    cell = page.locator(f'details[id="{anchor}"]')
    page.evaluate("window.scrollTo(0, 0)")
    assert not cell.evaluate("el => el.open") and not cell.locator("pre.code").is_visible()
    link = page.locator(f'[id="session-{wf_id}"] > .reflection a.cite[href="#{anchor}"]').first
    assert "cell 3" in link.inner_text() and "unsupported" not in link.get_attribute("class")
    link.click()
    assert cell.evaluate("el => el.open")
    code, output = cell.locator("pre.code"), cell.locator("pre.output")
    assert (
        code.is_visible() and "alpha = 42" in code.inner_text() and output.inner_text().strip() == "alpha 42"
    )
    box, height = cell.bounding_box(), page.evaluate("window.innerHeight")
    assert (
        box is not None and -2 < box["y"] < height and page.evaluate("window.scrollY") > 0
    )  # scrolled to it

    # unsupported citations are marked; the uncited learning says so
    bad = page.locator(f'[id="session-{wf_id}"] > .reflection .cite.unsupported')
    assert bad.count() == 2
    assert "no such cell" in bad.nth(0).inner_text() and "quote not printed" in bad.nth(1).inner_text()
    assert page.locator(".learning .tag", has_text="uncited").count() == 1
