"""The launcher's monitor (rpg.trainer_process.process.Monitor) reads what costs CPU only when it can tell something:
PSS when the run's summed RSS grew since the last PSS read (or a minute passed), the processes' /dev/shm mappings only
when a file of ``SHM_PREFIXES`` no read has listed is there; the processes (identities for the clean-up, CPU, RSS) at
every look. A stand-in psutil and clock: no process is started."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rpg.trainer_process import process as monitor_module
from rpg.trainer_process.process import PSS_AT_LEAST_EVERY_S, PSS_EVERY_S, SCAN_EVERY_S, SHM_RECHECK_S, Monitor

LOOK_S = 0.5  # the launcher's loop: a look every half second (rpg.trainer_process.run)

MB = 2**20


class Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


class FakeProcess:
    def __init__(self, world, pid):
        self.world, self.pid = world, pid

    def children(self, recursive=True):
        return [FakeProcess(self.world, pid) for pid in self.world.pids if pid != self.world.root]

    def create_time(self):
        return 1.0 + self.pid

    def cpu_times(self):
        return SimpleNamespace(user=1.0, system=0.5)

    def memory_info(self):
        return SimpleNamespace(rss=self.world.rss[self.pid])

    def memory_full_info(self):
        self.world.pss_reads += 1
        return SimpleNamespace(rss=self.world.rss[self.pid], pss=self.world.rss[self.pid] // 2)


class World:
    """The stand-in psutil: processes ``pids`` (the first the root) with RSS ``rss``; counts PSS reads."""

    def __init__(self, rss):
        self.rss = dict(rss)
        self.pids = list(self.rss)
        self.root = self.pids[0]
        self.pss_reads = 0
        self.NoSuchProcess = self.AccessDenied = LookupError

    def Process(self, pid):  # noqa: N802 (psutil's name)
        return FakeProcess(self, pid)

    def process_iter(self, attrs):
        return []

    def virtual_memory(self):
        return SimpleNamespace(total=100 * MB, available=50 * MB)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(monitor_module.time, "monotonic", c.monotonic)
    return c


def _monitor(world, tmp_path):
    m = Monitor(-1, "/nonexistent-ray-dir", tmp_path / "metrics.jsonl", None)
    m.psutil, m.root_pid = world, world.root
    return m


def test_pss_is_read_at_the_start_then_only_when_the_run_grew_or_a_minute_passed(clock, tmp_path, monkeypatch):
    monkeypatch.setattr(monitor_module, "shm_present", lambda: set())
    world = World({10: 100 * MB, 11: 300 * MB})
    m = _monitor(world, tmp_path)
    m.sample()
    assert world.pss_reads == 2 and m.peak_pss == 200 * MB and m.peak_rss == 400 * MB
    # a plateau: RSS read every second, PSS not again
    for _ in range(int(PSS_AT_LEAST_EVERY_S / LOOK_S) - 5):
        clock.now += LOOK_S
        m.sample()
    assert world.pss_reads == 2
    # the run grows: PSS is read again once PSS_EVERY_S has passed since the last read, and the peak follows
    world.rss[11] = 500 * MB
    clock.now += LOOK_S
    m.sample()
    assert world.pss_reads == 4 and m.peak_pss == 300 * MB and m.peak_rss == 600 * MB
    # grown again, but within PSS_EVERY_S of that read: RSS's peak follows, PSS waits for the next due read
    world.rss[11] = 700 * MB
    clock.now += PSS_EVERY_S / 2
    m.sample()
    assert world.pss_reads == 4 and m.peak_rss == 800 * MB
    clock.now += PSS_EVERY_S
    m.sample()
    assert world.pss_reads == 6 and m.peak_pss == 400 * MB
    # flat for a minute: one read whatever the RSS
    clock.now += PSS_AT_LEAST_EVERY_S + 1
    m.sample()
    assert world.pss_reads == 8


def test_every_look_records_the_processes_alive_then(clock, tmp_path, monkeypatch):
    monkeypatch.setattr(monitor_module, "shm_present", lambda: set())
    world = World({10: MB, 11: MB})
    m = _monitor(world, tmp_path)
    m.sample()
    world.pids.append(12)
    world.rss[12] = 2 * MB
    clock.now += LOOK_S
    m.sample()  # a process started since the last look: recorded for the clean-up, its CPU and RSS read
    assert {pid for pid, _ in m.seen} == {10, 11, 12} and m.cpu[12] == 1.5 and m.peak_rss == 4 * MB


def test_the_mappings_are_read_when_a_shared_memory_file_no_read_has_listed_appears(clock, tmp_path, monkeypatch):
    present: set[str] = set()
    reads = []

    ours = {"psm_ours"}  # what the run's processes map

    def mapped(pids):
        reads.append(clock.now)
        return ours & present

    monkeypatch.setattr(monitor_module, "shm_present", lambda: set(present))
    monkeypatch.setattr(monitor_module, "shm_mapped", mapped)
    m = _monitor(World({10: MB}), tmp_path)

    def minutes(n):  # the launcher's calls, every half second
        for _ in range(int(n * 120)):
            clock.now += 0.5
            m.sample()

    minutes(1)
    assert reads == []  # nothing in /dev/shm: no mappings read
    present.add("psm_ours")
    minutes(1)
    assert len(reads) == 1 and m.shm == {"psm_ours"}  # read once: the file is the run's, nothing left to learn
    present.add("psm_another_runs")
    minutes(0.1)
    assert len(reads) == 2 and m.shm == {"psm_ours"}  # a new name: read at the next scan
    minutes(2)  # a listed file no process of the run maps: read again every SHM_RECHECK_S, not every scan
    gaps = [b - a for a, b in zip(reads[1:], reads[2:])]
    assert len(gaps) >= 2 and all(SHM_RECHECK_S < g <= SHM_RECHECK_S + SCAN_EVERY_S + 1 for g in gaps), reads
    present.discard("psm_another_runs")
    n = len(reads)
    minutes(1)
    assert len(reads) == n
    # a listed file the run maps only later (another process of the run opened it by name) is found at a re-read
    present.add("psm_opened_later")
    minutes(0.1)
    assert "psm_opened_later" not in m.shm
    ours.add("psm_opened_later")
    minutes((SHM_RECHECK_S + SCAN_EVERY_S + 1) / 60)
    assert "psm_opened_later" in m.shm
