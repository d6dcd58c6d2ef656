"""pip's configuration as uv's arguments, one per line, for scripts/setup_env.sh: uv reads no pip.conf nor PIP_*.

The options are ``pip install``'s own, parsed by pip's parser from its files and PIP_* variables as an install would
see them: its precedence (PIP_* over ``[install]`` over ``[global]``, a later file over an earlier one), a later
setting replacing an earlier one (PIP_FIND_LINKS replaces the files' find-links, it does not add to them) and
multi-line values (``extra-index-url =`` then one URL a line). Its index (or none), extra indexes, find-links,
constraints and pre-releases become uv's flags, with ``--index-strategy unsafe-best-match`` as pip chooses across
indexes (the best version from any). A setting that would change what pip installs and that is not handed on (binary
or source only, hashes, upgrades, another target...) exits 2 naming it: pip installs then, not uv with another set.
Run by the venv's python, so pip is that venv's.
"""
from __future__ import annotations

import sys

# pip install's options (dests) that change what it installs where set (pip's defaults are all falsy); uv is not
# handed them
NOT_HANDED_ON = ("prefer_binary", "require_hashes", "ignore_dependencies", "upgrade", "ignore_installed", "target_dir",
                 "prefix_path", "root_path", "use_user_site", "requirements", "editables")


class NotHandedOn(Exception):
    pass


def pip_install_options():
    """``pip install``'s options with nothing on its command line: its configuration, as pip reads it."""
    from pip._internal.commands import create_command

    options, _ = create_command("install").parse_args([])
    return options


def uv_args(options) -> list[str]:
    """uv's flags from ``pip install``'s parsed options (``pip_install_options``). Raises NotHandedOn."""
    set_here = [dest for dest in NOT_HANDED_ON if getattr(options, dest, None)]
    if options.format_control.no_binary or options.format_control.only_binary:
        set_here.append("format_control (no-binary / only-binary)")
    if set_here:
        raise NotHandedOn(f"pip's configuration sets {', '.join(set_here)}, which uv is not handed")
    args = ["--no-index"] if options.no_index else ["--index-url", options.index_url]
    for flag, values in (("--extra-index-url", options.extra_index_urls), ("--find-links", options.find_links),
                         ("--constraint", options.constraints)):
        for value in values or []:
            args += [flag, value]
    if options.pre:
        args += ["--prerelease", "allow"]
    return args + ["--index-strategy", "unsafe-best-match"]


if __name__ == "__main__":
    try:
        print("\n".join(uv_args(pip_install_options())))
    except NotHandedOn as e:
        print(f"{e}: pip installs", file=sys.stderr)
        sys.exit(2)
