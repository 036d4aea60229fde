"""A path the user names, taken where the user is: one answer for the launcher, the demos and the study.

A relative path is relative to the caller's working directory (the scripts in ``recipe/rpg/`` leave it as
it is); ``~`` is the user's home; a URL (``hdfs://``, ``s3://``) is kept as written. The answer is absolute,
so a line that prints it can be opened, and a command that names it pasted, from any folder.
"""

from __future__ import annotations

from pathlib import Path


def user_path(raw: str | Path, cwd: Path | None = None) -> str:
    """``raw`` as an absolute path: relative -> to ``cwd`` (default: this process's working directory);
    URLs unchanged."""
    if "://" in str(raw):
        return str(raw)
    p = Path(raw).expanduser()
    return str(p if p.is_absolute() else ((cwd or Path.cwd()) / p).resolve())


def user_folder(raw: str | Path, cwd: Path | None = None) -> Path:
    """A folder the user names (``OUT``, ``OUT_DIR``, ``--out``), absolute (``user_path``)."""
    return Path(user_path(raw, cwd))


def unwritable(folder: Path) -> str | None:
    """Why this user cannot make or write ``folder`` (None: it can): the folder, or the nearest folder above it that
    exists, is not a folder, not writable or on a read-only file system. Nothing is created."""
    import os

    here = Path(folder)
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        return f"{here} is not a folder"
    if not os.access(here, os.W_OK | os.X_OK):
        try:
            read_only = os.statvfs(here).f_flag & os.ST_RDONLY
        except OSError:
            read_only = False
        return f"{here} is {'on a read-only file system' if read_only else 'not writable by this user'}"
    return None
