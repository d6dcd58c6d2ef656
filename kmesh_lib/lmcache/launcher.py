"""``lmcache server`` with kmesh's hooks installed before it serves, on LMCache 0.5.3 and 0.5.6.

    python -m kmesh_lib.lmcache.launcher --kmesh-hooks '{"io_log": ..., "retention_file": ...,
        "singleflight_file": ..., "warm_store_guard_file": ...}' <the arguments of `lmcache server`>

LMCache 0.5.3 (the GPU stack) has no ``--server-module`` extension point (0.5.6 added it), and its
``--runtime-plugin-locations`` runs plugins as separate processes. So this module runs the server
itself, exactly as the ``lmcache`` console script does (``lmcache.cli.main.main`` with
``argv = ["lmcache", "server", ...]``: the same argument parser, config objects, FastAPI app and
uvicorn server), with one difference: ``lmcache.v1.multiprocess.http_server.run_cache_server``,
which the app's startup (``lifespan``) calls to build the storage manager, prefetch controller and
L2 adapters, is wrapped so that ``server_plugin.install_hooks`` runs on the storage manager it
built, before the startup finishes. Uvicorn binds the HTTP port only after the startup, so
``/status`` answering means the hooks are in place (``plugin_ready`` in the I/O log says so too).
The ZMQ request port opens inside ``run_cache_server``, a moment before the hooks; the harness
connects vLLM only after ``/status`` answers.

Where the wrapped entry point is missing (another LMCache version), the launcher exits with a
one-line error naming it, before the server starts.
"""
from __future__ import annotations

import json
import sys

from kmesh_lib.lmcache.server_plugin import install_hooks

HOOKS_FLAG = "--kmesh-hooks"


def split_argv(argv: list[str]) -> tuple[dict, list[str]]:
    """(hooks config, the ``lmcache server`` arguments) from this module's command line."""
    if len(argv) < 2 or argv[0] != HOOKS_FLAG:
        raise SystemExit(f"usage: python -m kmesh_lib.lmcache.launcher {HOOKS_FLAG} JSON <lmcache server args>")
    cfg = json.loads(argv[1])
    missing = {"io_log", "retention_file", "singleflight_file", "warm_store_guard_file"} - set(cfg)
    if missing:
        raise SystemExit(f"{HOOKS_FLAG}: missing {', '.join(sorted(missing))}")
    return cfg, argv[2:]


def wrap_server_factory(cfg: dict) -> None:
    """Makes the HTTP app's startup install the hooks on the engine it builds."""
    try:
        from lmcache.v1.multiprocess import http_server
    except ImportError as e:
        raise SystemExit(f"kmesh launcher: this LMCache has no lmcache.v1.multiprocess.http_server ({e})") from e
    build = getattr(http_server, "run_cache_server", None)
    if build is None:
        raise SystemExit("kmesh launcher: lmcache.v1.multiprocess.http_server.run_cache_server not found "
                         "(an LMCache other than 0.5.3 / 0.5.6?)")

    def run_cache_server(*args, **kwargs):
        result = build(*args, **kwargs)
        if result is not None:  # (request server, MPCacheServer) with return_engine=True
            install_hooks(result[1].storage_manager, cfg)
        return result

    http_server.run_cache_server = run_cache_server


def main(argv: list[str]) -> None:
    cfg, server_args = split_argv(argv)
    wrap_server_factory(cfg)
    from lmcache.cli.main import main as lmcache_main

    sys.argv = ["lmcache", "server", *server_args]
    lmcache_main()


if __name__ == "__main__":
    main(sys.argv[1:])
