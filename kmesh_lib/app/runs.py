"""Where runs are, and how a command names one: by run id, never by an absolute path.

    runs/<section>/<run_id>/       local runs (ignored by git; ``KMESH_RUN_ROOT`` moves them)
    outputs/<section>/<run_id>/    the published set (tracked; ``KMESH_PUBLISHED_ROOT`` moves it)

A command takes ``RUN_ID`` (looked up in both places, local first), ``--latest`` (the newest run id
by the time it names, ``base.records.run_id_sort_key``; never a file's mtime; never a live panel's
run, ``base.records.is_live_run_id``) or ``--run-dir``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kmesh_lib.base.paths import REPO_ROOT, published_root
from kmesh_lib.base.records import RunFiles, is_live_run_id, run_id_sort_key, run_root

LOCAL, PUBLISHED = "local", "published"


class RunNotFound(LookupError):
    """No run, or more than one, answers to what a command was given."""


def roots() -> dict[str, Path]:
    return {LOCAL: run_root(), PUBLISHED: published_root()}


@dataclass(frozen=True)
class RunRef:
    section: ModuleType
    run_dir: Path
    where: str  # local | published | given (--run-dir)

    @property
    def run_id(self) -> str:
        return self.run_dir.name


def display_path(path: Path) -> str:
    """``path`` relative to the checkout or the working directory where it lies inside one."""
    path = Path(path).resolve()
    for base in (REPO_ROOT, Path.cwd()):
        if path.is_relative_to(base):
            return str(path.relative_to(base)) or "."
    return str(path)


def runs_of(section: ModuleType, where: tuple[str, ...] = (LOCAL, PUBLISHED)) -> list[RunRef]:
    """Every run folder of ``section``, oldest run id first."""
    found = []
    for kind in where:
        folder = roots()[kind] / section.KEY
        if folder.is_dir():
            found += [RunRef(section, p, kind) for p in folder.iterdir() if p.is_dir()]
    return sorted(found, key=lambda r: (run_id_sort_key(r.run_id), r.where))


def recorded_section(run_dir: Path) -> str | None:
    """The section key a run folder's results.json names; None where it names none or cannot be read
    (verify then says what is wrong with the folder)."""
    key = RunFiles(run_dir).readable_results.get("section")
    return key if isinstance(key, str) else None


def find_run(section: ModuleType, run_id: str | None = None, latest: bool = False, run_dir: str | None = None,
             profile: str | None = None, where: tuple[str, ...] = (LOCAL, PUBLISHED)) -> RunRef:
    """The one run that ``run_id``, ``latest`` or ``run_dir`` names (exactly one of them)."""
    given = [x for x in (run_id, latest or None, run_dir) if x]
    if len(given) != 1:
        recent = [r.run_id for r in runs_of(section, where)][-3:]
        raise RunNotFound(f"name one run of {section.KEY}: RUN_ID, --latest or --run-dir"
                          + (f" (latest: {', '.join(reversed(recent))})" if recent else f" (no runs under {where})"))
    if run_dir:
        path = Path(run_dir)
        if not path.is_dir():
            raise RunNotFound(f"--run-dir {run_dir}: no such folder")
        recorded = recorded_section(path)
        if recorded and recorded != section.KEY:
            raise RunNotFound(f"--run-dir {run_dir}: a run of {recorded}, not of {section.KEY} "
                              f"(its results.json says so)")
        return RunRef(section, path, "given")
    if latest:
        runs = [r for r in runs_of(section, where) if (profile is None or r.run_id.startswith(profile + "-"))
                and not is_live_run_id(r.run_id)]  # a live panel's run sorts after its parent: never the latest
        if not runs:
            raise RunNotFound(f"no run of {section.KEY}" + (f" with profile {profile}" if profile else "")
                              + " under " + " or ".join(display_path(roots()[w] / section.KEY) for w in where))
        return runs[-1]
    if "/" in run_id or run_id in (".", ".."):
        raise RunNotFound(f"{run_id!r} is not a run id (a folder: use --run-dir)")
    for kind in where:
        path = roots()[kind] / section.KEY / run_id
        if path.is_dir():
            return RunRef(section, path, kind)
    raise RunNotFound(f"no run {run_id} of {section.KEY} under "
                      + " or ".join(display_path(roots()[w] / section.KEY) for w in where))


def find_any(name: str, sections: list[ModuleType]) -> RunRef:
    """A run named ``RUN_ID`` or ``SECTION/RUN_ID`` in any section (``kmesh compare``); a run id's last part alone
    (``a47e``) where exactly one run's id ends with it."""
    key, _, run_id = name.rpartition("/")
    candidates = [s for s in sections if not key or key in (s.KEY, s.NUMBER)]
    if key and not candidates:
        raise RunNotFound(f"{name}: no section {key!r}")
    found = []
    for section in candidates:
        try:
            found.append(find_run(section, run_id))
        except RunNotFound:
            pass
    if not found and run_id and run_id not in (".", ".."):  # the short id the listings show: a47e
        # a published run is often still in runs/ (publish copies it): one run, its local copy first as find_run's
        seen: dict[tuple[str, str], RunRef] = {}
        for s in candidates:
            for kind, root in roots().items():
                for path in sorted((root / s.KEY).glob(f"*-{run_id}")):
                    if path.is_dir():
                        seen.setdefault((s.KEY, path.name), RunRef(s, path, kind))
        found = list(seen.values())
        if len(found) > 1:
            raise RunNotFound(f"{run_id} ends {len(found)} run ids ({', '.join(r.run_id for r in found[:4])}"
                              f"{', ...' if len(found) > 4 else ''}): write the whole id")
    if not found:
        raise RunNotFound(f"no run {run_id} in any section")
    if len({r.section.KEY for r in found}) > 1:
        raise RunNotFound(f"run id {run_id} exists in {', '.join(r.section.KEY for r in found)}: "
                          "write SECTION/RUN_ID")
    return found[0]
