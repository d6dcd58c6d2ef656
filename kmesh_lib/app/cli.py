"""kmesh: run, check and publish the sections' notebooks.

    plan SECTION      arms, sizes and expected duration; starts no engine
    run SECTION       validate params, execute the notebook headlessly into runs/<section>/<run_id>/,
                      render report.html and verify the run
    verify SECTION RUN_ID|--latest|--run-dir DIR
                      recompute every check from the run's files; exit 1 on a failure, 2 on a damaged run
    publish SECTION RUN_ID [--allow-failed --why SENTENCE] [--allow-smoke]
                      copy a finished, verified run into outputs/<section>/<run_id>/ in the
                      published format, with public-results.json, and regenerate
                      outputs/index.html and the README table
    withdraw SECTION RUN_ID --why SENTENCE [--superseded-by RUN_ID]
                      remove a published run and list it, with why, under the withdrawn runs
    report SECTION RUN_ID
                      render report.html again
    list [SECTION] [--section S] [--passed] [--latest] [--live]
                      runs (local and published) with status and headline figures, a line each
    compare RUN_A RUN_B
                      two runs' figures side by side, with the differences
    index             regenerate outputs/index.html and the README table from the published runs
    data fetch [--from DIR] | data verify
                      get the pinned data sets into the data root and check them against the manifests

Exit status: 0 ok; 1 a run or check failed (or publish refused it); 2 bad input or a damaged run
folder (one line naming what is wrong); 130 Ctrl-C.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from pathlib import Path

import yaml

from kmesh_lib.app import data as data_cmd
from kmesh_lib.app import registry as sections
from kmesh_lib.app.compact import folder_bytes
from kmesh_lib.app.execute import execute
from kmesh_lib.app.listing import add_figures, compare_lines, list_lines, summarize_run
from kmesh_lib.app.publish import PublishRefused, publish, withdraw
from kmesh_lib.app.published import PublishedSetError, regenerate, standing
from kmesh_lib.app.registry import SectionError, SectionInterfaceError, UnknownSection
from kmesh_lib.app.report import PUBLISHED_STYLESHEET, render_report
from kmesh_lib.app.runs import LOCAL, PUBLISHED, RunNotFound, display_path, find_any, find_run, published_root, runs_of
from kmesh_lib.app.verify import verify
from kmesh_lib.base import params as params_mod
from kmesh_lib.base.params import resolve_params
from kmesh_lib.base.paths import repo_relative
from kmesh_lib.base.public import PublicContentError
from kmesh_lib.base.records import (
    RUNNER_ENV,
    RunFileError,
    RunFiles,
    RunFolderInUse,
    RunRecord,
    claim_run_dir,
    end_run,
    is_live_run_id,
    new_run_dir,
    refuse_published,
    runner_env,
)
from kmesh_lib.engine.costs import GPU_TIME

USAGE_ERRORS = (params_mod.ParamError, UnknownSection, SectionInterfaceError, RunNotFound, RunFileError,
                RunFolderInUse, SectionError, PublicContentError, PublishedSetError)


def cmd_plan(args) -> int:
    section = sections.get(args.section, needs=sections.PLANNING)
    config, values, files = resolve_params(section, args.profile, args.params, args.set)
    print(f"section {section.NUMBER} {section.KEY}: {section.QUESTION}")
    if files:
        print("params files: " + " -> ".join(display_path(f) for f in files))
    else:  # a section with no YAML layer for this profile (17): the profile changes no value, and says so
        print(f"params files: none for profile {args.profile} (section {section.NUMBER}'s defaults and --set "
              "values only)")
    lines = section.plan(config)
    for key, value in lines.items():
        print(f"{key}: {value}")
    if getattr(config, "DEVICE", None) == "cuda" and GPU_TIME not in lines:
        print(f"{GPU_TIME}: not estimated (section {section.NUMBER}'s plan states none)")
    return 0


def cmd_run(args) -> int:
    section = sections.get(args.section)
    for flag, path in (("--run-dir", args.run_dir), ("--source-run", args.source_run)):
        if path:
            refuse_published(path, flag)  # published runs change only by publish and withdraw
    if args.source_run:  # a run measured elsewhere (a GPU driver's folder): render into it, measure nothing
        if args.set or args.params or args.run_dir:
            raise params_mod.ParamError("--source-run renders the run as it was measured: no --set, --params or --run-dir")
        run_dir, resolved = source_run_params(section, args.source_run)
    else:
        config, _, _ = resolve_params(section, args.profile, args.params, args.set, for_run=True)  # before any engine
        run_dir = claim_run_dir(Path(args.run_dir)) if args.run_dir else new_run_dir(section.KEY, args.profile)
        resolved = {**params_mod.to_dict(config), "RUN_DIR": str(run_dir.resolve())}
        if getattr(config, "DEVICE", None) == "cuda":  # what the run will hold of the device, before it starts
            print(f"{GPU_TIME} (plan): {section.plan(config).get(GPU_TIME, 'not estimated')}", flush=True)
        (run_dir / "params.resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=True))
    shown = display_path(run_dir)
    print(f"running {section.NOTEBOOK} ({resolved.get('PROFILE')}) -> {shown}", flush=True)
    notebook = sections.notebook_path(section)
    os.environ[RUNNER_ENV] = runner_env()  # the kernel records this process as the run's runner
    where = run_dir.resolve()  # papermill runs the kernel from notebooks/: a relative --source-run would land there
    outcome = execute(notebook, where / section.NOTEBOOK, resolved, args.kernel, notebook.parent, args.timeout,
                      args.log_output, kernel_log=where / "logs" / "kernel.log")
    if outcome.status != "completed":
        end_run(run_dir, section.KEY, outcome.status, outcome.error)
        if outcome.status == "failed":
            record_stopped_run(section, run_dir)
    try:
        rendered = render_report(section, run_dir)
        if rendered.answer_error and outcome.status == "completed":
            print(f"report.html has no answer: {rendered.answer_error}", file=sys.stderr)
    except (RunFileError, SectionError) as e:
        if outcome.status == "completed":
            print(f"report.html not rendered: {e}", file=sys.stderr)
    left = (f"; ended {len(outcome.reaped)} processes it left behind: {', '.join(outcome.reaped[:4])}"
            if outcome.reaped else "")
    if outcome.status == "interrupted":
        print(f"interrupted: {shown} (status interrupted{left})")
        return 130
    if left:
        print(left.removeprefix("; "), file=sys.stderr)
    if outcome.status == "failed":
        where = "; the kernel's last words are in logs/kernel.log" if outcome.error["kind"] == "dead kernel" else ""
        print(f"failed: {shown} (notebook {outcome.line()}{where})")
        return 1
    verdict = verify(section, RunFiles(run_dir))
    for line in verdict.lines:
        if line.kind != "ok":
            print(f"  {line.text()}")
    for record_line in verdict.record_lines:
        if not record_line.ok:
            print(f"  {record_line.text()}")
    passed = verdict.ok and verdict.status == "passed"
    print(f"{verdict.status}: {shown} ({verdict.summary()}); report.html there; {publish_hint(section, run_dir, passed)}")
    return 0 if passed else 1


def record_stopped_run(section, run_dir: Path) -> None:
    """A notebook that stopped before its checks cell (a display that raised: section 21's floor plot of a run with
    no restore path, 060001-01f9) left results.json without its checks, their counts and the files' hashes, so
    verify could only say the record stops short. The section's checks, computed from the run's files as the checks
    cell computes them, are recorded with their counts and the hashes (``RunRecord.seal``); the status stays
    ``failed`` with the notebook's error and no ``finished_utc``. A run whose files the checks cannot read keeps
    the record as it stopped, and says why."""
    if "checks" in RunFiles(run_dir).readable_results:  # the checks cell ran: its record stands
        return
    try:
        checks = sections.call_section(section, "checks", RunFiles(run_dir))
    except (RunFileError, SectionError) as e:
        print(f"checks not recorded (the notebook stopped before its checks cell): {e}", file=sys.stderr)
        return
    RunRecord(run_dir, section.KEY).seal(checks)


def publish_hint(section, run_dir: Path, passed: bool) -> str:
    """What ``kmesh publish`` takes for this run: a smoke run is refused without --allow-smoke, a run that did not
    pass without --allow-failed and its why (the hint named the bare command for both)."""
    command = f"kmesh publish {section.NUMBER} {run_dir.name}"
    if resolved_profile(run_dir) == "smoke":
        return f"a smoke run tests the pipeline and measures nothing ({command} --allow-smoke publishes it anyway)"
    if not passed:
        return f"it did not pass ({command} --allow-failed --why SENTENCE publishes it marked so)"
    return f"publish with: {command}"


def resolved_profile(run_dir: Path) -> str | None:
    try:
        return RunFiles(run_dir).recorded_params.get("PROFILE")
    except RunFileError:
        return None


def source_run_params(section, source: str) -> tuple[Path, dict]:
    """``--source-run DIR``: the measured run's own parameters (never re-resolved from a profile).

    The notebook renders into DIR itself (``SOURCE_RUN``): params.resolved.yaml, env.json (the
    measuring machine) and raw/ stay as measured, nothing is copied, and the rendering machine is
    recorded as ``render_environment``. DIR is passed relative to the repository where it lies in it.
    """
    run_dir = Path(source)
    if "SOURCE_RUN" not in {f.name for f in dataclasses.fields(section.Params)}:
        raise params_mod.ParamError(f"--source-run: section {section.NUMBER} measures its own runs only")
    params_file = run_dir / "params.resolved.yaml"
    try:
        found = run_dir.is_dir() and params_file.is_file()
    except OSError:  # a symlink loop
        found = False
    if not found:
        raise params_mod.ParamError(f"--source-run {source}: no params.resolved.yaml there (not a run folder)")
    values = params_mod.current_names(params_mod.read_yaml(params_file))
    where = repo_relative(run_dir) or str(run_dir.resolve())
    values.update(RUN_DIR=where, SOURCE_RUN=where)
    config = params_mod.build(section.Params, values, where=str(params_file))
    RunFiles(run_dir, section=section.KEY).read_captures()  # a damaged capture is named before the kernel starts
    return run_dir, params_mod.to_dict(config)


def _ref(args, section, where=(LOCAL, PUBLISHED)):
    return find_run(section, args.run_id, args.latest, args.run_dir, args.profile, where)


def cmd_verify(args) -> int:
    section = sections.get(args.section)
    ref = _ref(args, section)
    verdict = verify(section, RunFiles(ref.run_dir), first_problem=args.first_problem)
    for line in verdict.lines:
        print(line.text())
    for record_line in verdict.record_lines:
        print(record_line.text())
    print(f"{verdict.summary()}: {section.KEY} {ref.run_id} ({ref.where}, {display_path(ref.run_dir)})")
    return 0 if verdict.ok else 1


def cmd_report(args) -> int:
    section = sections.get(args.section)
    ref = _ref(args, section)
    published = ref.where == PUBLISHED or ref.run_dir.resolve().is_relative_to(published_root().resolve())  # or --run-dir
    RunFiles(ref.run_dir).read_everything()  # a damaged file is named, as verify and publish name it, before a page
    rendered = render_report(section, ref.run_dir, stylesheet=PUBLISHED_STYLESHEET if published else None)
    if rendered.answer_error:
        print(f"no answer in the report: {rendered.answer_error}", file=sys.stderr)
    print(display_path(rendered.path))
    return 0


def cmd_publish(args) -> int:
    section = sections.get(args.section)
    ref = _ref(args, section)
    try:
        done = publish(section, ref.run_dir, allow_failed=args.allow_failed, replace=args.replace, why=args.why,
                       allow_smoke=args.allow_smoke)
    except PublishRefused as e:
        print(f"kmesh publish: {e}", file=sys.stderr)
        return 1
    marked = " (marked: published with --allow-failed)" if done.public["allowed_failed"] else ""
    print(f"published {section.KEY} {ref.run_id}{marked} -> {display_path(done.run_dir)}; "
          f"{done.verdict.summary()}; index: {display_path(published_root() / 'index.html')}")
    c = done.compacted
    print(f"  {folder_bytes(done.run_dir):,} bytes; {len(c.figures)} figures moved out of the notebook; "
          f"{len(c.compressed)} captures xz-compressed")
    for entry in c.moved:
        print(f"  figure: {entry}")
    for entry in c.left_out:
        print(f"  left out: {entry}")
    for name, other in done.public["shared_captures"].items():
        print(f"  raw/{name}: the same content as {other}'s (kept: each run folder is complete)")
    return 0


def cmd_withdraw(args) -> int:
    section = sections.get(args.section, needs=sections.PLANNING)
    try:
        entry = withdraw(section, args.run_id, args.why, args.superseded_by)
    except PublishRefused as e:
        print(f"kmesh withdraw: {e}", file=sys.stderr)
        return 1
    kept = f"; the files stay in git at {entry['commit'][:12]}" if entry.get("commit") else ""
    print(f"withdrew {section.KEY} {args.run_id} ({entry['why']}){kept}; "
          f"index: {display_path(published_root() / 'index.html')}")
    return 0


def cmd_list(args) -> int:
    named = ([args.section] if args.section else []) + args.sections
    chosen = [sections.get(name) for name in dict.fromkeys(named)] if named else sections.all_sections()
    where = {"local": (LOCAL,), "published": (PUBLISHED,), "all": (LOCAL, PUBLISHED)}[args.where]
    refs = [ref for section in chosen for ref in runs_of(section, where) if is_live_run_id(ref.run_id) == args.live]
    summaries = [summarize_run(ref, figures=False) for ref in refs]
    stand = {id(d) for d in standing([s.public for s in summaries if s.public]).values()}
    for s in summaries:
        s.stands = s.public is not None and id(s.public) in stand  # the run README and the index stand on
    if args.passed:
        summaries = [s for s in summaries if s.status == "passed"]
    if args.latest:  # runs_of gives each section's runs oldest first
        summaries = list({s.ref.section.KEY: s for s in summaries}.values())
    if not summaries:
        print("no runs" + (" (live runs are listed with --live)" if not args.live else ""))
        return 0
    for s in summaries:
        add_figures(s)
    columns = shutil.get_terminal_size((0, 0)).columns  # COLUMNS, else the terminal's; 0: output to a file
    for line in list_lines(summaries, columns or None):
        print(line)
    return 0


def cmd_compare(args) -> int:
    everything = sections.all_sections()
    a, b = (summarize_run(find_any(name, everything), with_counts=True) for name in (args.run_a, args.run_b))
    if a.ref.section is not b.ref.section:
        print(f"note: comparing runs of two sections ({a.ref.section.KEY}, {b.ref.section.KEY})")
    params = []
    for s in (a, b):
        try:
            params.append(RunFiles(s.ref.run_dir).recorded_params)
        except RunFileError as e:
            s.problem = s.problem or str(e)
            params.append({})
    for line in compare_lines(a, b, *params):
        print(line)
    return 0


def cmd_index(args) -> int:
    """Regenerates the listings, after verifying every published run: one whose record is not what its files
    show (an edited table, hash, count or public file) is refused; a run published as failed lists as such."""
    refused = []
    for folder in sorted(p for p in published_root().glob("*/*") if p.is_dir() and not p.name.startswith(".")):
        try:
            verdict = verify(sections.get(folder.parent.name), RunFiles(folder))
        except (RunFileError, UnknownSection, SectionError) as e:
            refused.append(f"{folder.parent.name}/{folder.name}: {e}")
            continue
        if verdict.record_problems:
            refused.append(f"{folder.parent.name}/{folder.name}: {verdict.record_problems[0].text()}")
    if refused:
        for line in refused:
            print(f"kmesh index: refused {line}"[:300], file=sys.stderr)
        print(f"kmesh index: {len(refused)} published runs do not verify; nothing written", file=sys.stderr)
        return 1
    index, readme = regenerate(published_root())
    print(f"wrote {display_path(index)}" + (f" and the results table in {display_path(readme)}" if readme else ""))
    return 0


# each subcommand's line in ``kmesh --help`` and the first line of its own --help
COMMAND_HELP = {
    "plan": "arms, sizes and expected duration of a section's run; starts no engine",
    "run": "validate params, execute a section's notebook headlessly into runs/<section>/<run_id>/, render "
           "report.html and verify the run",
    "verify": "recompute every check from a run's files; exit 1 on a failure, 2 on a damaged run",
    "publish": "copy a finished, verified run into outputs/<section>/<run_id>/ and regenerate the listings",
    "report": "render a run's report.html again",
    "withdraw": "remove a published run and list it, with why, under the withdrawn runs",
    "list": "runs (local and published) with status and headline figures, a line each",
    "compare": "two runs' figures side by side, with the differences",
    "index": "regenerate outputs/index.html and the README table from the published runs",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, except that a usage error is one line (what is wrong, and where the usage is), exit 2: argparse
    prints its usage block first, three lines and more before the error. Subcommands' parsers are of this class."""

    def error(self, message: str):
        self.exit(2, params_mod.one_line(f"{self.prog}: {message} (usage: {self.prog} --help)") + "\n")


def cell_timeout(text: str) -> int:
    """--timeout: whole seconds, 1 .. a week (0 and below meant no timeout at all to papermill, unsaid)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: expected whole seconds") from None
    if not 1 <= value <= params_mod.MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{value}: must be 1 to {params_mod.MAX_SECONDS} seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="kmesh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, description: str | None = None) -> argparse.ArgumentParser:
        text = COMMAND_HELP[name]
        return sub.add_parser(name, help=text, description=description or text[0].upper() + text[1:] + ".")

    for name, fn in (("plan", cmd_plan), ("run", cmd_run)):
        p = add(name)
        p.set_defaults(fn=fn)
        p.add_argument("section", help="section number or key, e.g. 00 or engine_check")
        p.add_argument("--profile", choices=params_mod.PROFILES, default="cpu")
        p.add_argument("--params", action="append", default=[], help="extra YAML file layered last")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one parameter")
    run = sub.choices["run"]
    run.add_argument("--kernel", default="kmesh", help="Jupyter kernel (scripts/setup_env.sh installs 'kmesh')")
    run.add_argument("--timeout", type=cell_timeout, default=3600,
                     help=f"per-cell timeout in seconds (1 to {params_mod.MAX_SECONDS})")
    run.add_argument("--log-output", action="store_true", help="print each cell's output as it runs")
    run.add_argument("--run-dir", default=None, help="an empty or new folder for the run (default: runs/<section>/<id>)")
    run.add_argument("--source-run", default=None, metavar="DIR",
                     help="render a run measured elsewhere (a GPU driver's folder) into that folder; no engine")
    for name, fn in (("verify", cmd_verify), ("publish", cmd_publish), ("report", cmd_report)):
        p = add(name)
        p.set_defaults(fn=fn)
        p.add_argument("section", help="section number or key")
        p.add_argument("run_id", nargs="?", default=None, help="the run id (a folder name under runs/ or outputs/)")
        p.add_argument("--latest", action="store_true", help="the newest run id (by the time it names)")
        p.add_argument("--profile", choices=params_mod.PROFILES, default=None, help="with --latest: of this profile")
        p.add_argument("--run-dir", default=None, help="a run folder given by path")
    sub.choices["verify"].add_argument(
        "--first-problem", action="store_true",
        help="stop at the first kind of problem (a gate over many runs): files that differ from the SHA-256s the "
             "run recorded, then a declared table that differs from results.json; without it every check is "
             "recomputed")
    publish_parser = sub.choices["publish"]
    publish_parser.add_argument("--allow-failed", action="store_true",
                                help="publish a run that did not pass, marked as such in the public file and index")
    publish_parser.add_argument("--why", default="", metavar="SENTENCE",
                                help="with --allow-failed: one sentence saying why the run failed (shown with it)")
    publish_parser.add_argument("--replace", action="store_true", help="publish over an earlier copy of this run")
    publish_parser.add_argument("--allow-smoke", action="store_true",
                                help="publish a smoke-profile run (a tiny model: it tests the pipeline, measures nothing)")
    p = add("withdraw")
    p.set_defaults(fn=cmd_withdraw)
    p.add_argument("section", help="section number or key")
    p.add_argument("run_id", help="the published run's id")
    p.add_argument("--why", required=True, metavar="SENTENCE", help="one sentence: why the run is withdrawn")
    p.add_argument("--superseded-by", default=None, metavar="RUN_ID", help="the published run that replaces it")
    p = add("list", description="Runs (local and published) with status and headline figures, oldest first; the "
                                "live panel's runs only with --live.")
    p.set_defaults(fn=cmd_list)
    p.add_argument("section", nargs="?", default=None, help="section number or key (or --section)")
    p.add_argument("--section", dest="sections", action="append", default=[], metavar="SECTION",
                   help="only this section's runs (repeatable)")
    p.add_argument("--where", choices=("all", "local", "published"), default="all")
    p.add_argument("--passed", action="store_true", help="only runs whose status is passed")
    p.add_argument("--latest", action="store_true", help="only each section's newest run (after the other filters)")
    p.add_argument("--live", action="store_true",
                   help="only the runs a notebook's live panel started (section 20), which are otherwise left out")
    p = add("compare")
    p.set_defaults(fn=cmd_compare)
    p.add_argument("run_a", help="RUN_ID or SECTION/RUN_ID")
    p.add_argument("run_b", help="RUN_ID or SECTION/RUN_ID")
    add("index").set_defaults(fn=cmd_index)
    data_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except USAGE_ERRORS as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(params_mod.one_line(f"kmesh {args.command}: {message}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kmesh {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
