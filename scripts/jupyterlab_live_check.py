"""Section 20's live panel in JupyterLab, driven by a headless Chromium (issue 43).

    python scripts/jupyterlab_live_check.py --shots DIR [--lead MS] [--timeout S]

What it does, all under one temp folder (removed at the end unless ``--keep``), nothing in the repository:

1. resolves the smoke profile as ``kmesh run 20 --profile smoke`` does (a new run folder under a temp
   ``KMESH_RUN_ROOT``, its ``params.resolved.yaml``) and injects those values into a copy of the notebook
   (papermill ``prepare_only``: the same injected-parameters cell a run gets);
2. starts JupyterLab on 127.0.0.1, a free port, a random token, the temp folder as its root;
3. in Chromium (playwright, ``/usr/bin/chromium``; no browser is downloaded) opens the notebook, runs every
   cell (the smoke measurement runs in the notebook's kernel), moves the panel's lead slider with the keyboard
   to ``--lead`` and presses Run, then waits for the live run to end;
4. checks (a) the live run folder's ``results.json`` says passed and ``kmesh verify 20 --run-dir`` passes it,
   (b) the panel's figure shows the new point: the image the browser shows equals the lead sweep drawn from the
   run's groups plus the live folder's, has an early point at the lead that it lacked before Run, and differs
   from the image before Run;
5. saves ``before.png`` (slider moved, before Run), ``running.png`` (progress bar) and ``after.png`` in DIR.

Every process it starts (JupyterLab, the kernel, the live run's engine child, Chromium) is ended in a
``finally``: this process is a child subreaper while it runs, so what they leave behind is re-parented here
and reaped (``app.execute.reap_descendants``). Exit 0 when every check passes; each failed one is printed.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHROMIUM = "/usr/bin/chromium"
KERNEL = "kmesh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(tmp: Path) -> tuple[Path, Path, object]:
    """The smoke run folder (as ``kmesh run 20 --profile smoke`` makes it) and the notebook copy with its values."""
    import papermill
    import yaml

    from kmesh_lib.base import params as params_mod
    from kmesh_lib.base.params import resolve_params
    from kmesh_lib.base.records import new_run_dir
    from kmesh_lib.sections import prefetch as section

    config, _, _ = resolve_params(section, "smoke", [], [], for_run=True)
    run_dir = new_run_dir(section.KEY, "smoke")
    resolved = {**params_mod.to_dict(config), "RUN_DIR": str(run_dir.resolve())}
    (run_dir / "params.resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=True))
    lab = tmp / "lab"
    lab.mkdir()
    notebook = lab / section.NOTEBOOK
    papermill.execute_notebook(str(REPO / "notebooks" / section.NOTEBOOK), str(notebook), parameters=resolved,
                               kernel_name=KERNEL, prepare_only=True, progress_bar=False)
    return notebook, run_dir, config


def start_lab(tmp: Path, port: int, token: str) -> subprocess.Popen:
    settings = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    log = open(tmp / "jupyterlab.log", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp / 'lab'}",
         "--LabApp.expose_app_in_browser=True", "--ServerApp.terminals_enabled=False"]
        + (["--allow-root"] if os.geteuid() == 0 else []),  # a container's root: the server is bound to 127.0.0.1
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp / "lab",
        env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
             "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")})


def wait_for_lab(base: str, token: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited ({proc.returncode}) before it served")
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer within {timeout_s:.0f} s")


def shut_down_kernels(base: str, token: str) -> None:
    """Asks the server to end its kernels (their own exit handlers run); the reaper ends what is left."""
    headers = {"Authorization": f"token {token}"}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{base}/api/kernels", headers=headers), timeout=5) as r:
            kernels = json.load(r)
        for k in kernels:
            req = urllib.request.Request(f"{base}/api/kernels/{k['id']}", method="DELETE", headers=headers)
            urllib.request.urlopen(req, timeout=30).close()
    except OSError:
        pass


# the panel's status line: the HTML widget in the widget box that holds the lead slider
STATUS_JS = ("() => [...document.querySelectorAll('.widget-vbox')].filter(b => b.querySelector('.widget-slider'))"
             ".map(b => b.querySelector('.widget-html-content')?.innerText || '').join('')")
IMAGE_JS = """async () => {
    const img = document.querySelector('.jp-OutputArea-output img.widget-image');
    if (!img) return null;
    const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
    let s = ''; for (const b of bytes) s += String.fromCharCode(b);
    return btoa(s);
}"""


def panel_image(page) -> bytes | None:
    data = page.evaluate(IMAGE_JS)
    return base64.b64decode(data) if data else None


def run_all(page, timeout_s: float) -> bool:
    """Runs every cell through JupyterLab's own command (what Run > Run All Cells does); True if all passed."""
    page.evaluate("() => { window.__runAll = null; window.jupyterapp.commands.execute('notebook:run-all-cells')"
                  ".then(ok => { window.__runAll = ok; }, e => { window.__runAll = String(e); }); }")
    page.wait_for_function("() => window.__runAll !== null", timeout=timeout_s * 1000, polling=1000)
    return page.evaluate("() => window.__runAll") is True


def move_slider(page, lead_ms: float) -> float:
    """Moves the lead slider with the keyboard (its handle focused, arrow keys by its 5 ms step) to ``lead_ms``."""
    readout = page.locator(".widget-slider .widget-readout").first
    handle = page.locator(".widget-slider .noUi-handle").first
    handle.scroll_into_view_if_needed()
    handle.click()
    for _ in range(400):
        value = float(readout.inner_text())
        if abs(value - lead_ms) < 1e-9:
            break
        handle.press("ArrowRight" if value < lead_ms else "ArrowLeft")
    # each step redraws in the kernel (continuous_update): wait for the last one, however busy the machine
    page.wait_for_function(f"() => ({STATUS_JS})().includes('press Run to measure {lead_ms:g} ms')", timeout=300_000,
                           polling=500)
    return float(readout.inner_text())


def screenshot(page, path: Path) -> None:
    page.locator(".widget-slider").first.scroll_into_view_if_needed()
    page.locator("img.widget-image").first.scroll_into_view_if_needed()
    page.screenshot(path=str(path))
    print(f"screenshot: {path}", flush=True)


def expected_images(run_dir: Path, live_dir: Path | None, cfg, lead_ms: float) -> tuple[bytes, list[dict]]:
    """The figure the panel should show, drawn here from the files (the run's groups, plus the live run's)."""
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.prefetch import live
    from kmesh_lib.sections.prefetch.experiment import groups_of
    from kmesh_lib.sections.prefetch.plots import lead_sweep_figure, png
    from kmesh_lib.sections.prefetch.stats import lead_sweep

    groups = groups_of(RunFiles(run_dir)) + (live.recorded_groups(live_dir, cfg) if live_dir else [])
    only = (cfg.PATHS[0], cfg.GROUP_SIZES[0])
    rows = [r for r in lead_sweep(groups) if (r["path"], r["group_size"]) == only and r["arm"] == "early"
            and abs(r["lead_ms"] - lead_ms) < 1e-9]
    return png(lead_sweep_figure(groups, only=only, highlight_ms=lead_ms)), rows


def drive(args, tmp: Path, failures: list[str]) -> None:
    from playwright.sync_api import sync_playwright

    from kmesh_lib.base.records import LIVE_MARK, RunFiles

    notebook, run_dir, cfg = prepare(tmp)
    port, token = free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    lab = start_lab(tmp, port, token)
    try:
        wait_for_lab(base, token, lab, 120)
        print(f"JupyterLab on {base} (root {tmp / 'lab'}); run folder {run_dir}", flush=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                page.goto(f"{base}/lab/tree/{notebook.name}?token={token}")
                page.wait_for_function("() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session"
                                       "?.kernel?.status === 'idle'", timeout=180_000, polling=500)
                started = time.monotonic()
                ok = run_all(page, args.timeout)
                print(f"run all cells: {'every cell passed' if ok else 'a cell failed'} "
                      f"({time.monotonic() - started:.0f} s)", flush=True)
                if not ok:
                    failures.append("running the notebook's cells in JupyterLab failed (see the notebook in --keep)")
                    page.screenshot(path=str(args.shots / "failed.png"), full_page=True)
                    return
                page.locator(".widget-slider").first.wait_for(timeout=60_000)
                first = panel_image(page)
                lead = move_slider(page, args.lead)
                print(f"slider at {lead:g} ms", flush=True)
                before = panel_image(page)
                expected_before, rows_before = expected_images(run_dir, None, cfg, lead)
                screenshot(page, args.shots / "before.png")
                if before == first:
                    failures.append("moving the slider did not redraw the panel's figure")
                if before != expected_before:
                    failures.append("the figure after moving the slider is not the lead sweep of the run's groups")
                page.locator(".widget-button", has_text="Run").first.click()
                page.locator(".widget-hprogress").first.wait_for(state="visible", timeout=30_000)
                page.wait_for_function(f"() => {{ const p = document.querySelector('.widget-hprogress .progress-bar');"
                                       f" const t = ({STATUS_JS})(); return (p && parseFloat(p.style.width) > 0)"
                                       f" || t.startsWith('recorded in') || t.startsWith('live run failed'); }}",
                                       timeout=args.timeout * 1000, polling=500)
                screenshot(page, args.shots / "running.png")
                page.wait_for_function(f"() => {{ const t = ({STATUS_JS})(); return t.startsWith('recorded in')"
                                       " || t.startsWith('live run failed'); }", timeout=args.timeout * 1000, polling=1000)
                status = page.evaluate(STATUS_JS)
                print(f"panel: {status}", flush=True)
                after = panel_image(page)
                screenshot(page, args.shots / "after.png")
            except Exception:
                page.screenshot(path=str(args.shots / "failed.png"))
                print(f"screenshot: {args.shots / 'failed.png'}", flush=True)
                raise
            finally:
                browser.close()
    finally:
        shut_down_kernels(base, token)
        lab.terminate()
        try:
            lab.wait(timeout=15)
        except subprocess.TimeoutExpired:
            lab.kill()

    lives = sorted((run_dir.parent).glob(f"{run_dir.name}{LIVE_MARK}*"))
    if len(lives) != 1:
        failures.append(f"expected one live run folder next to {run_dir.name}, found {len(lives)}")
        return
    live_dir = lives[0]
    print(f"live run folder: {live_dir}", flush=True)
    status = RunFiles(live_dir).readable_results.get("status")
    if status != "passed":
        failures.append(f"live run status is {status!r}, not passed (its engine.log: {live_dir / 'engine.log'})")
    verify = subprocess.run([sys.executable, "-m", "kmesh_lib.app.cli", "verify", "20", "--run-dir", str(live_dir)],
                            capture_output=True, text=True, cwd=REPO)
    print(f"kmesh verify (exit {verify.returncode}): {verify.stdout.strip().splitlines()[-1:]}", flush=True)
    if verify.returncode != 0:
        failures.append(f"kmesh verify 20 --run-dir {live_dir} exited {verify.returncode}:\n{verify.stdout[-2000:]}")
    expected_after, rows_after = expected_images(run_dir, live_dir, cfg, lead)
    if rows_before:
        failures.append(f"the run already had early groups at {lead:g} ms: pick a lead it did not record")
    if not rows_after:
        failures.append(f"the live run's groups give no early point at {lead:g} ms")
    else:
        r = rows_after[0]
        print(f"the new point: lead {r['lead_ms']:g} ms, {r['groups']} groups, {r['ready']} ready, "
              f"A's first token median {r['A first token ms (median)']:.1f} ms", flush=True)
    if after == before:
        failures.append("the panel's figure did not change after the live run")
    if after != expected_after:
        failures.append("the panel's figure after the live run is not the lead sweep of the run's and live groups")
    (args.shots / "panel-after.png").write_bytes(after or b"")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shots", type=Path, required=True, help="folder for the screenshots (made if missing)")
    parser.add_argument("--lead", type=float, default=150.0,
                        help="the lead (ms) to move the slider to: one the smoke run does not record (default 150)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for running the cells and for the live run")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (its path is printed)")
    args = parser.parse_args(argv)
    try:
        import playwright  # noqa: F401
    except ImportError:
        print("playwright is not installed (pip install playwright; it drives /usr/bin/chromium, nothing is downloaded)")
        return 2
    if not Path(CHROMIUM).exists():
        print(f"no Chromium at {CHROMIUM}")
        return 2
    args.shots.mkdir(parents=True, exist_ok=True)
    from kmesh_lib.app.execute import _set_subreaper, reap_descendants

    tmp = Path(tempfile.mkdtemp(prefix="kmesh-live-check-"))
    os.environ.update(KMESH_RUN_ROOT=str(tmp / "runs"), PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    from kmesh_lib.base.records import RUNNER_ENV, runner_env

    os.environ[RUNNER_ENV] = runner_env()  # the kernel records this process as the run's runner, as under kmesh run
    subreaper = _set_subreaper(True)
    failures: list[str] = []
    try:
        drive(args, tmp, failures)
    except Exception as e:  # noqa: BLE001 - one line, then the cleanup below
        failures.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        left = reap_descendants(exclude=set())
        if subreaper:
            _set_subreaper(False)
        if left:
            print(f"ended {len(left)} processes left behind: {', '.join(left[:6])}")
        if args.keep:
            print(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print(f"FAILED: {f}")
    print("passed" if not failures else f"failed ({len(failures)})")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
