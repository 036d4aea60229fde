"""Watching a trainer run while it runs: its output copied to the log, its memory and CPU sampled, its new
metric records forwarded.

``pump_output`` copies the trainer's output to ``trainer.log`` (each line prefixed with the seconds since
start), to this terminal (``echo``) and to the caller (``on_line``), and never stops draining the pipe before
the trainer's end, even when the log cannot be written (a full disk). ``Monitor`` samples the run's processes
every 0.5 s (RSS, CPU seconds; PSS every ``PSS_EVERY_S``: ``TrainerRun.peak_pss_bytes``, the run's RAM),
records each process's identity for the clean-up (``rpg.trainer_process.reaping``) and forwards the records
verl's file logger appended since the last sample (``on_metrics``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from rpg.metrics_log.file import readable_records
from rpg.trainer_process.reaping import identities, procs_using, shm_mapped
from rpg.trainer_process.result import TrainerRun

PSS_EVERY_S = 10.0  # seconds between PSS samples (peak_pss_bytes); memory plateaus last far longer


def pump_output(stream, log, echo: bool, t0: float, on_line: Callable[[str], None] | None = None,
          run: TrainerRun | None = None) -> None:
    """Copy the trainer's output to the log file, each line prefixed with the seconds since start.

    It never stops draining the pipe before the trainer's end (a full pipe blocks the trainer, and the
    launcher then waited its whole timeout): when the log cannot be written (ENOSPC, EIO, ...) the first
    error is recorded in ``run.output_error`` (the launcher then stops the run) and every later line is
    read and counted in ``run.discarded_lines``."""
    for line in iter(stream.readline, b""):
        if run is None or run.output_error is None:
            try:
                log.write(f"[{time.time() - t0:7.1f}s] ".encode() + line)
                log.flush()
            except OSError as e:
                if run is None:
                    raise
                run.output_error = f"{run.log_file}: {e.strerror or e}"
        if run is not None and run.output_error is not None:
            run.discarded_lines += 1
        if echo:
            sys.stdout.write(line.decode(errors="replace"))
            sys.stdout.flush()
        if on_line is not None:
            on_line(line.decode(errors="replace"))


class Monitor:
    """Samples memory of the run's processes and forwards new metric records."""

    def __init__(self, root_pid: int, ray_tmp: str, metrics_file: Path, on_metrics):
        import psutil

        self.psutil = psutil
        self.root_pid, self.ray_tmp = root_pid, ray_tmp
        self.metrics_file, self.on_metrics = metrics_file, on_metrics
        self.seen: set[tuple[int, float]] = set(identities([root_pid]))  # (pid, start time) of each process
        self.peak_rss = 0
        self.peak_pss = 0
        self._last_pss = 0.0
        self.sys0 = self._sys_used()
        self.peak_sys = 0
        self.cpu: dict[int, float] = {}  # pid -> user + system CPU seconds when last sampled
        self._offset = 0
        self._last_scan = 0.0
        self.shm: set[str] = set()  # /dev/shm files mapped by a process of the run (SHM_PREFIXES)

    def _sys_used(self) -> int:
        vm = self.psutil.virtual_memory()
        return int(vm.total - vm.available)

    def procs(self) -> list:
        ps = []
        try:
            root = self.psutil.Process(self.root_pid)
            ps = [root, *root.children(recursive=True)]
        except self.psutil.NoSuchProcess:
            pass
        if time.time() - self._last_scan > 5:  # Ray daemons may re-parent; find them by temp dir
            self._last_scan = time.time()
            ps += procs_using(self.psutil, self.ray_tmp)
            self.shm |= shm_mapped(p.pid for p in ps)
        return ps

    def sample(self) -> None:
        rss = pss = 0
        # PSS reads every mapping of every process (/proc/<pid>/smaps): ~20-40 ms per verl process,
        # 0.3-0.7 s of CPU for a run's ~19 processes, i.e. a third of a core if sampled every 2 s on a
        # 2-core machine. RSS (cheap) is sampled every 0.5 s, PSS every PSS_EVERY_S.
        with_pss = time.time() - self._last_pss > PSS_EVERY_S
        for p in {p.pid: p for p in self.procs()}.values():
            try:
                self.seen.add((p.pid, p.create_time()))
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                continue
            try:
                times = p.cpu_times()
                self.cpu[p.pid] = times.user + times.system
                if with_pss:
                    info = p.memory_full_info()
                    rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
                else:
                    rss += p.memory_info().rss
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                pass
        if with_pss:
            self._last_pss = time.time()
            self.peak_pss = max(self.peak_pss, pss)
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_sys = max(self.peak_sys, self._sys_used() - self.sys0)
        if self.on_metrics is not None and self.metrics_file.exists():
            # never fatal: a line that is no record is skipped here, the history is read again at the end
            found, self._offset = readable_records(self.metrics_file, self._offset)
            for step, data in found:
                self.on_metrics(step, data)
