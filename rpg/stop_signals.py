"""Stopping a run on SIGHUP, SIGINT or SIGTERM (a closed terminal or lost ssh, Ctrl-C, ``kill``).

Python's defaults differ per signal: SIGHUP and SIGTERM end the process at once (no ``finally``,
so the trainer and its Ray processes live on unseen), SIGINT raises ``KeyboardInterrupt`` (a raw
traceback). ``raise_on_stop_signals`` turns all three into ``StopSignal``, a ``SystemExit`` whose
code follows the shell's 128 + signal number convention, so every ``finally`` on the way out runs
(the CPU harness terminates its process tree there; the driver, ``rpg.verl.main``, shuts Ray down).
The first signal wins: later ones are ignored while the clean-up runs (bounded by the clean-up's
own timeouts), so that an impatient second Ctrl-C cannot leave processes behind.
"""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


class StopSignal(SystemExit):
    """Raised in the main thread by a stop signal; ``code`` = 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class _Handlers:
    """Installed stop handlers: call to restore the previous ones; ``reassert`` after a library
    replaced one (``ray.init`` installs its own SIGTERM handler, which exits without our clean-up)."""

    def __init__(self, handler, previous: dict, received: list[int]):
        self.handler, self.previous, self.received = handler, previous, received
        self.held = False

    def hold(self) -> None:
        """From now on a stop signal is only recorded in ``received`` (a clean-up must not be cut short)."""
        self.held = True

    def reassert(self) -> None:
        if self.handler is not None and threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                signal.signal(s, self.handler)

    def __call__(self) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)


def raise_on_stop_signals() -> _Handlers:
    """Install the handlers (main thread only; elsewhere a no-op); call the result to restore the
    previous ones."""
    if threading.current_thread() is not threading.main_thread():
        return _Handlers(None, {}, [])
    received: list[int] = []

    def handler(signum, frame):
        if received or installed.held:  # already stopping, or cleaning up: record only
            received[:] = received or [signum]
            return
        received.append(signum)
        raise StopSignal(signum)

    installed = _Handlers(handler, {}, received)
    installed.previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    return installed
