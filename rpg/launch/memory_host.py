"""Old import path of the host-RAM estimate, kept only because rpg/launch/cli.py still imports ``report``,
``HOST_MEM_ENV`` and ``host_mem_gib`` from here. The code is in the package rpg/launch/memory/ (host.py,
formatting.py), which re-exports these names: delete this file once cli.py imports them from
``rpg.launch.memory``."""

from rpg.launch.memory import HOST_MEM_ENV, host_mem_gib, report

__all__ = ["HOST_MEM_ENV", "host_mem_gib", "report"]
