"""Prints the facts about the installed vLLM and LMCache that kmesh's GPU paths depend on."""
import inspect
import os

import lmcache
import vllm
from vllm.engine.arg_utils import EngineArgs

print("vllm", vllm.__version__, "lmcache", getattr(lmcache, "__version__", "?"))
print("EngineArgs has kv_cache_memory_bytes:", "kv_cache_memory_bytes" in EngineArgs.__dataclass_fields__)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

print("Scheduler.__init__:", list(inspect.signature(Scheduler.__init__).parameters))
from vllm.v1.core.block_pool import BlockPool  # noqa: E402

print("BlockPool methods:", [m for m in ("touch", "free_blocks", "get_new_blocks", "_maybe_evict_cached_block") if hasattr(BlockPool, m)])
try:
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

    print("LocalDiskBackend.read_file:", inspect.signature(LocalDiskBackend.read_file) if hasattr(LocalDiskBackend, "read_file") else None)
    print("LocalDiskBackend methods:", [m for m in dir(LocalDiskBackend) if "read" in m or "load" in m or "get" in m][:30])
except Exception as e:  # noqa: BLE001
    print("LocalDiskBackend:", repr(e))
try:
    from lmcache.v1.config import _CONFIG_DEFINITIONS

    print("lmcache config keys:", sorted(_CONFIG_DEFINITIONS)[:200])
except Exception as e:  # noqa: BLE001
    print("config:", repr(e))
try:
    import lmcache.cli.commands.server  # noqa: F401
    print("lmcache MP server: present")
except Exception as e:  # noqa: BLE001
    print("lmcache MP server:", repr(e))
print("prefetch policy module:", os.path.exists(os.path.join(os.path.dirname(lmcache.__file__), "v1/distributed/storage_controllers/prefetch_policy.py")))
os._exit(0)
