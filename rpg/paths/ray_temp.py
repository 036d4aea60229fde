"""The run's private Ray temporary folder (``ray_kwargs.ray_init._temp_dir``), made where Ray's socket paths fit.

Ray names its Unix sockets ``<folder>/session_<%Y-%m-%d_%H-%M-%S_%f>_<pid>/sockets/<name>`` (``ray/_private/node.py``:
the session name, the sockets folder; the names ``plasma_store``, ``raylet`` with a ``.N`` when taken, and
``dash_<module>``, the longest ``dash_TaskEventsHead``) and stops, after its processes have started, on one longer
than 107 bytes (``ray._private.utils.validate_socket_filepath``: AF_UNIX's 108 with the closing NUL). A folder under a
long ``TMPDIR`` (an HPC job's ``/scratch/slurm_job_12345678/tmp``) passes it: ``make_ray_temp`` then makes the run's
folder under the first of ``SHORT_BASES`` where it fits, and says so; where none does, one line refuses before Ray.
The driver refuses a private Ray's folder (``ray_kwargs.ray_init._temp_dir``, else Ray's default under ``RAY_TMPDIR``
or ``TMPDIR``) that ``fits`` rejects (``rpg.verl.joined_cluster.ray_folder_problem``).
"""

from __future__ import annotations

import os
import tempfile

SOCKET_MAX = 107
# what Ray adds below its folder: "/session_", the date (26 bytes), "_", a pid of up to 7 digits (Linux's pid_max is
# at most 4194304), "/sockets/" and a socket name of up to 24 bytes (19 used)
RAY_TAIL = len("/session_") + 26 + 1 + 7 + len("/sockets/") + 24
PREFIX = "rpgray"
_RANDOM = 8  # the characters tempfile.mkdtemp adds to the prefix
SHORT_BASES = ("/tmp", "/var/tmp", "/dev/shm")


class RayTempError(Exception):
    """No folder where Ray's socket paths fit (one line: the temporary folder, its length, the limit)."""


def fits(folder: str) -> bool:
    """Whether Ray's longest socket path under ``folder`` stays within ``SOCKET_MAX`` bytes."""
    return len(os.fsencode(folder)) + RAY_TAIL <= SOCKET_MAX


def default_folder(environ) -> tuple[str, str]:
    """(the folder a Ray started without ``_temp_dir`` uses, what decides it): ``$RAY_TMPDIR/ray``, else
    ``$TMPDIR/ray``, else Ray's built-in default on Linux, the system's ``/tmp`` plus ``ray`` (Ray's own rule:
    ``ray._common.utils.get_default_ray_temp_dir``; not a path of any machine of ours)."""
    for var in ("RAY_TMPDIR", "TMPDIR"):
        if var in environ:
            return os.path.join(environ[var], "ray"), var
    return os.path.join("/tmp", "ray"), "Ray's default"


def longest_base() -> int:
    """The longest temporary folder (bytes) under which the run's own folder still fits."""
    return SOCKET_MAX - RAY_TAIL - len(f"/{PREFIX}") - _RANDOM


def make_ray_temp(base: str | None = None) -> tuple[str, str | None]:
    """(a new empty folder for Ray, the note to print or None). Made under ``base`` (default: the temporary folder,
    ``TMPDIR``) where Ray's paths fit there, else under the first writable folder of ``SHORT_BASES`` where they do
    (the note names both); ``RayTempError`` when none is. The caller removes the folder (only it)."""
    base = base or tempfile.gettempdir()
    if fits(os.path.join(base, PREFIX + "x" * _RANDOM)):
        return tempfile.mkdtemp(prefix=PREFIX, dir=base), None
    for short in SHORT_BASES:
        if os.path.isdir(short) and os.access(short, os.W_OK | os.X_OK) and fits(os.path.join(short, PREFIX + "x" * _RANDOM)):
            folder = tempfile.mkdtemp(prefix=PREFIX, dir=short)
            return folder, (f"Ray's temporary folder is {folder}: under the temporary folder {base} "
                            f"({len(os.fsencode(base))} bytes; TMPDIR) Ray's socket paths would pass {SOCKET_MAX} bytes")
    raise RayTempError(f"TMPDIR={base} is {len(os.fsencode(base))} bytes long: Ray's socket paths under it would pass "
                       f"{SOCKET_MAX} bytes and none of {', '.join(SHORT_BASES)} is a writable folder; set TMPDIR to a "
                       f"folder of at most {longest_base()} bytes")
