"""Watching a trainer run while it runs: its output copied to the log, its memory and CPU sampled, its new
metric records forwarded.

``pump_output`` copies the trainer's output to ``trainer.log`` (each line prefixed with the seconds since
start), to this terminal (``echo``) and to the caller (``on_line``), and never stops draining the pipe before
the trainer's end, even when the log cannot be written (a full disk). ``Monitor`` samples the run's processes
each time the launcher looks, every 0.5 s (RSS, CPU seconds; PSS when the run may be at a new peak:
``TrainerRun.peak_pss_bytes``, the run's RAM), records each process's identity for the clean-up
(``rpg.trainer_process.reaping``) and forwards the records verl's file logger appended since the last sample
(``on_metrics``).

What the monitor costs is CPU the run does not get (the CI stages run two launches on two cores): on a run's ~20
processes, listing them and reading their CPU and RSS takes ~10 ms, their PSS ~250 ms (/proc/<pid>/smaps_rollup walks
every page table) and their /dev/shm mappings ~35 ms (/proc/<pid>/maps, thousands of lines per torch process). So PSS
is read when the summed RSS has grown since the last PSS read (PSS mostly grows where RSS does; it also rises with
RSS flat when a process outside the run that shared its pages ends, which the read at least every
``PSS_AT_LEAST_EVERY_S`` catches if it lasts), and the mappings only when /dev/shm lists a file of ``SHM_PREFIXES`` that
no read has attributed (a new name at the next scan, one mapped by none of the run's processes every ``SHM_RECHECK_S``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from rpg.metrics_log.file import readable_records
from rpg.trainer_process.reaping import identities, procs_using, shm_mapped, shm_present
from rpg.trainer_process.result import TrainerRun

PSS_EVERY_S = 10.0  # the least time between PSS reads; one is taken then if the summed RSS grew by PSS_GROWTH
PSS_GROWTH = 1.02  # since the last PSS read (memory plateaus last far longer than 10 s)
PSS_AT_LEAST_EVERY_S = 60.0  # and one at least this often whatever the RSS
SCAN_EVERY_S = 5.0  # Ray daemons found by the run's temp dir; /dev/shm listed for new files of SHM_PREFIXES
SHM_RECHECK_S = 30.0  # how often the mappings are read again while a listed file is mapped by no process of the run


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
        self._last_pss = -float("inf")  # time.monotonic() of the last PSS read
        self._rss_at_pss = 0  # the summed RSS then
        self.sys0 = self._sys_used()
        self.peak_sys = 0
        self.cpu: dict[int, float] = {}  # pid -> user + system CPU seconds when last sampled
        self._offset = 0
        self._last_scan = self._last_maps = -float("inf")  # time.monotonic() of the last scan, mappings read
        self.shm: set[str] = set()  # /dev/shm files mapped by a process of the run (SHM_PREFIXES)
        self._shm_listed: set[str] = set()  # every SHM_PREFIXES file listed at a mappings read (mapped or not)

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
        now = time.monotonic()
        if now - self._last_scan > SCAN_EVERY_S:  # Ray daemons may re-parent; find them by temp dir
            self._last_scan = now
            ps += procs_using(self.psutil, self.ray_tmp)
            present = shm_present()
            unknown = present - self.shm
            if unknown - self._shm_listed or (unknown and now - self._last_maps > SHM_RECHECK_S):
                self._last_maps = now
                self._shm_listed |= present
                self.shm |= shm_mapped(p.pid for p in ps)
        return ps

    def _pss_due(self, rss: int) -> bool:
        since = time.monotonic() - self._last_pss
        return since > PSS_AT_LEAST_EVERY_S or (since > PSS_EVERY_S and rss > self._rss_at_pss * PSS_GROWTH)

    def sample(self) -> None:
        self._sample_processes()
        if self.on_metrics is not None and self.metrics_file.exists():
            # never fatal: a line that is no record is skipped here, the history is read again at the end
            found, self._offset = readable_records(self.metrics_file, self._offset)
            for step, data in found:
                self.on_metrics(step, data)

    def _sample_processes(self) -> None:
        ps = list({p.pid: p for p in self.procs()}.values())
        rss_by: dict[int, int] = {}
        for p in ps:
            try:
                self.seen.add((p.pid, p.create_time()))
                times = p.cpu_times()
                self.cpu[p.pid] = times.user + times.system
                rss_by[p.pid] = p.memory_info().rss
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                pass
        rss = sum(rss_by.values())
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_sys = max(self.peak_sys, self._sys_used() - self.sys0)
        if self._pss_due(rss):
            pss = 0
            for p in ps:
                if p.pid in rss_by:
                    try:
                        pss += getattr(p.memory_full_info(), "pss", rss_by[p.pid])
                    except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                        pass
            self._last_pss, self._rss_at_pss = time.monotonic(), rss
            self.peak_pss = max(self.peak_pss, pss)
