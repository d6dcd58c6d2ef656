"""kmesh plan|run|verify|publish SECTION --profile P

    plan     print arms, sizes and expected duration; starts no engine
    run      validate params, execute the section's notebook headlessly with papermill into
             outputs/<section>/<run_id>/, render report.html, verify and publish
    verify   re-check a finished run's recorded invariants; exit 1 when one fails
    publish  write public-results.json (aggregates and hashes; no prompts, answers or token ids)
    report   render a run's executed notebook to report.html again
    data     fetch or verify the pinned data sets (kmesh data fetch [--from DIR])
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from kmesh_lib.app import data as data_cmd
from kmesh_lib.app import registry as sections
from kmesh_lib.app.publish import publish
from kmesh_lib.app.verify import verify_run
from kmesh_lib.base import params as params_mod
from kmesh_lib.base.params import resolve_params
from kmesh_lib.base.paths import OUTPUTS
from kmesh_lib.base.records import new_run_id


def latest_run(section, profile: str | None) -> Path:
    root = OUTPUTS / section.KEY
    runs = sorted((p for p in root.glob("*") if (p / "results.json").exists()
                   and (profile is None or p.name.startswith(profile + "-"))), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise SystemExit(f"no finished run of {section.KEY} under {root}" + (f" for profile {profile}" if profile else ""))
    return runs[-1]


def cmd_plan(args) -> int:
    section = sections.get(args.section)
    config, values, files = resolve_params(section, args.profile, args.params, args.set)
    print(f"section {section.NUMBER} {section.KEY}: {section.QUESTION}")
    print("params files: " + " -> ".join(str(f.relative_to(params_mod.PARAMS_DIR.parent)) if f.is_absolute() and
                                           params_mod.PARAMS_DIR.parent in f.parents else str(f) for f in files))
    for key, value in section.plan(config).items():
        print(f"{key}: {value}")
    return 0


def cmd_run(args) -> int:
    import papermill

    section = sections.get(args.section)
    config, _, _ = resolve_params(section, args.profile, args.params, args.set)  # fails before any engine
    run_dir = Path(args.run_dir) if args.run_dir else OUTPUTS / section.KEY / new_run_id(args.profile)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = {**params_mod.to_dict(config), "RUN_DIR": str(run_dir.resolve())}
    (run_dir / "params.resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=True))
    out_nb = run_dir / section.NOTEBOOK
    print(f"running {section.NOTEBOOK} ({args.profile}) -> {run_dir}", flush=True)
    t0 = time.monotonic()
    try:
        papermill.execute_notebook(str(sections.notebook_path(section)), str(out_nb), parameters=resolved,
                                   kernel_name=args.kernel, cwd=str(sections.notebook_path(section).parent),
                                   execution_timeout=args.timeout, log_output=args.log_output, progress_bar=not args.log_output)
    except papermill.PapermillExecutionError as e:
        print(f"notebook failed in cell {e.exec_count}: {e.ename}: {e.evalue}\n"
              f"the partial notebook and every result written so far are in {run_dir}", file=sys.stderr)
        render_html(out_nb)
        return 1
    finally:
        print(f"notebook ran {time.monotonic() - t0:.0f} s", flush=True)
    html = render_html(out_nb)
    print(f"report: {html}")
    status = report_checks(run_dir)
    if status == 0:

        print(f"public results: {publish(run_dir)}")
    return status


def render_html(notebook: Path) -> Path | None:
    """Renders the executed notebook to report.html; a missing nbconvert template only warns,
    since the notebook itself is the record (``kmesh report`` renders it again later)."""
    import nbformat

    if not notebook.exists():
        return None
    try:
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter().from_notebook_node(nbformat.read(str(notebook), as_version=4))
    except (ImportError, ValueError, OSError) as e:
        print(f"report.html not rendered ({type(e).__name__}: {str(e).splitlines()[0]}); "
              f"render it later with: kmesh report --run-dir {notebook.parent}", file=sys.stderr)
        return None
    out = notebook.parent / "report.html"
    out.write_text(body)
    return out


def report_checks(run_dir: Path) -> int:

    checks = verify_run(run_dir)
    for c in checks:
        print(f"  [{'ok' if c.ok else 'FAIL'}] {c.name}" + (f": {c.detail}" if c.detail and not c.ok else ""))
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed in {run_dir}")
    return 1 if failed else 0


def cmd_verify(args) -> int:
    section = sections.get(args.section)
    return report_checks(Path(args.run_dir) if args.run_dir else latest_run(section, args.profile))


def cmd_report(args) -> int:
    section = sections.get(args.section)
    run_dir = Path(args.run_dir) if args.run_dir else latest_run(section, args.profile)
    html = render_html(run_dir / section.NOTEBOOK)
    print(html or "not rendered")
    return 0 if html else 1


def cmd_publish(args) -> int:

    section = sections.get(args.section)
    print(publish(Path(args.run_dir) if args.run_dir else latest_run(section, args.profile)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kmesh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn in (("plan", cmd_plan), ("run", cmd_run), ("verify", cmd_verify), ("publish", cmd_publish),
                     ("report", cmd_report)):
        p = sub.add_parser(name, help=fn.__doc__)
        p.add_argument("section", help="section number or key, e.g. 00 or engine_check")
        finished_only = name in ("verify", "publish", "report")
        p.add_argument("--profile", choices=params_mod.PROFILES, default=None if finished_only else "cpu")
        p.set_defaults(fn=fn)
        if name in ("plan", "run"):
            p.add_argument("--params", action="append", default=[], help="extra YAML file layered last")
            p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one parameter")
        if name == "run":
            p.add_argument("--kernel", default="kmesh", help="Jupyter kernel (scripts/setup_env.sh installs 'kmesh')")
            p.add_argument("--timeout", type=int, default=3600, help="per-cell timeout in seconds")
            p.add_argument("--log-output", action="store_true", help="stream cell output instead of a progress bar")
        p.add_argument("--run-dir", default=None, help="the run directory (default: new for run, latest otherwise)")
    data_cmd.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (params_mod.ParamError, KeyError) as e:
        print(f"kmesh {args.command}: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
