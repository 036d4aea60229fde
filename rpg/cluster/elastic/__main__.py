"""``python -m rpg.cluster.elastic``: the entrypoint of a Ray job submitted with ``NNODES=MIN:MAX`` (the package's
text). Exit code: the trainer's (0 when the run finished), 1 when it stopped after a node loss it could not
recover from (the trainer's stop line printed last), 2 when another run holds the checkpoint folder, 128 + signum
after ``ray job stop``."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Sequence

from rpg.stop_signals import StopSignal, raise_on_stop_signals
from rpg.cluster.elastic.cluster import ray_cluster
from rpg.cluster.elastic.attempts import parse_args, submission_id, write_json
from rpg.cluster.elastic.supervisor import Supervisor, say


def main(argv: Sequence[str] | None = None) -> int:
    import ray

    from rpg.config import RPGConfigError
    from rpg.verl import folder_lock
    from rpg.verl.errors import ERROR_PREFIX

    plan = parse_args(sys.argv[1:] if argv is None else argv)
    ray.init(address="auto", log_to_driver=False, logging_level="ERROR")
    handlers = raise_on_stop_signals()  # after ray.init, which installs its own SIGTERM handler
    supervisor = Supervisor(plan, ray_cluster(), os.environ)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "submission": submission_id(os.environ), "command": plan.argv}
    code = 1
    try:
        try:
            _, token = folder_lock.acquire(str(plan.folder), f"elastic supervisor pid {os.getpid()} on "
                                                            f"{socket.gethostname()}")
        except RPGConfigError as e:
            print(f"{ERROR_PREFIX}: {e}", file=sys.stderr, flush=True)
            code = 2
            return code
        supervisor.environ = {**os.environ, folder_lock.TOKEN_ENV: token}
        say(f"supervisor pid {os.getpid()} recorded in {write_json(plan.state / 'supervisor.json', record)}")
        code = supervisor.run()
        return code
    except StopSignal as stop:
        handlers.hold()
        code = stop.code
        if supervisor.child is not None and supervisor.child.poll() is None:
            supervisor.stop_child()  # Ray's job stop sent it a SIGTERM too: the trainer prints its stop line
        elif supervisor.stop_line:  # between two trainers: the last one's stop line says how to resume
            print(supervisor.stop_line, file=sys.stderr, flush=True)
        say(f"stopped by {stop.name}; nothing restarted")
        return code
    finally:
        handlers.hold()
        if supervisor.child is not None and supervisor.child.poll() is None:  # an error of the supervisor itself
            supervisor.stop_child()
        handlers()
        if (plan.state / "supervisor.json").is_file():
            write_json(plan.state / "supervisor.json", {**record, "ended": time.time(), "exit_code": code})
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
