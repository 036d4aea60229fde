"""Put on a GPU kit step's PYTHONPATH (``rpg_lab.gpu_kit.stall``): every Python process of the step (the driver, Ray's
workers, vLLM's engine core and workers, spawned or forked) registers ``faulthandler`` for SIGUSR1, writing all its
threads' stacks to ``$RPG_GPU_KIT_STACKS/<pid>.txt``, so that the kit can ask each one where it is before it stops a
step that ran out of time. Inert without that variable; never raises. Then it runs the next ``sitecustomize`` on
the path, which this one shadows.
"""

import os


def _register() -> None:
    import faulthandler
    import signal
    import sys

    folder = os.environ.get("RPG_GPU_KIT_STACKS")
    if not folder or not os.path.isdir(folder):
        return
    f = open(os.path.join(folder, f"{os.getpid()}.txt"), "a", buffering=1)  # kept open: the handler writes here
    f.write(f"# pid {os.getpid()} ppid {os.getppid()}: {' '.join(sys.argv)[:500]}\n")
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
    globals()["_file"] = f


def _safely() -> None:
    try:
        _register()
    except Exception:  # noqa: BLE001 - a process of the step must start whatever happens here
        pass


def _chain() -> None:
    import importlib.machinery
    import importlib.util
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_safely()
os.register_at_fork(after_in_child=_safely)  # a forked child: its own file, under its own pid
try:
    _chain()
except Exception:  # noqa: BLE001
    pass
