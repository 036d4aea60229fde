"""Run a command that is stopped when the launcher that started it dies, however it dies.

    python -m rpg.trainer_process.stop_with_launcher <launcher pid> -- <command ...>

A launcher (the CPU harness) starts the trainer in a session of its own, so that one signal to that
session's process group stops the run. The launcher stops it on SIGHUP, SIGINT, SIGTERM and when it
exits; but a launcher killed with SIGKILL (``kill -9``, the OOM killer, a preempted job step) runs no
code at all, and the trainer then trained on to its last step where nobody sees it, its output going
nowhere, writing into the run's directory while the user restarts into it (measured: ``kill -9`` of
the tiny launcher at step 4 of 8, the driver logged steps 5-8 in the next 30 s).

This module asks the kernel (Linux ``prctl(PR_SET_PDEATHSIG)``) to send SIGTERM to the process when
its parent dies, then replaces itself with the command (``execv``: same pid, same session; the setting
survives the exec). SIGTERM is a stop signal the RPG driver handles (``rpg.verl.main.stop_on_signals``:
Ray shut down, exit 128 + 15); Ray's own head processes share the driver's fate. If the launcher is
already gone when the setting is made, nothing would deliver it: the command is not started (exit
128 + SIGTERM). Elsewhere than Linux the command runs untethered (the launcher's own stop handling
still applies).
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def set_parent_death_signal(signum: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``signum`` to this process when its parent dies; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def command(launcher_pid: int, argv: list[str]) -> list[str]:
    """``argv`` run through this module, tethered to ``launcher_pid`` (the process that will start it)."""
    return [sys.executable, "-m", "rpg.trainer_process.stop_with_launcher", str(launcher_pid), "--", *argv]


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--" or not args[0].isdecimal():
        print("usage: python -m rpg.trainer_process.stop_with_launcher <launcher pid> -- <command ...>",
              file=sys.stderr)
        return 2
    launcher, argv = int(args[0]), args[2:]
    tethered = set_parent_death_signal(signal.SIGTERM)
    if tethered and os.getppid() != launcher:  # it died before the kernel was told: nobody would stop us
        return 128 + signal.SIGTERM
    os.execv(argv[0], argv)
    return 0  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
