"""Runs on a Vast.ai node under the run's python (standard library only; sent as this file's text by
launcher/places/vast/autostop.py): the node's side of autostop. Two operations:

- `where ENVIRON_FILE`: where the instance's own CONTAINER_API_KEY is, "environment" or "process 1" (Vast's SSH
  sessions do not see the container's variables: its first process's environ file has them), or "absent". The key
  itself is never printed.
- `watch WORKSPACE API_URL INSTANCE_ID IDLE_S POLL_S SOURCE ENVIRON_FILE`: leave the SSH session (sent after
  launcher/remote/daemon.py's text, whose `detach` answers "watching"), then every POLL_S seconds look whether the
  node's training has ended (WORKSPACE/exit_code) and nothing has pulled (.autostop/pulled) for IDLE_S seconds; then
  stop the instance (PUT /api/v0/instances/ID/ {"state": "stopped"}) with its key, read only then: SOURCE
  "container" (CONTAINER_API_KEY, from the environment or ENVIRON_FILE) or "scoped" (.autostop/key). What it does
  is in WORKSPACE/.autostop/state.json: watching | stopped | failed (with the error), and its pid (read by
  launcher/remote/autostop_state.sh)."""

import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

KEY_NAME = "CONTAINER_API_KEY"
STATE_DIR = ".autostop"
RETRIED_STATUSES = (429, 500, 502, 503, 504)
STOP_ATTEMPTS = 12


def key_in_environ_file(path: str) -> str:
    """The first non-empty CONTAINER_API_KEY in a NUL-separated environ file (/proc/PID/environ), stripped; ""
    when there is none or the file cannot be read."""
    try:
        with open(path, "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return ""
    for item in items:
        name, _, value = item.partition(b"=")
        if name == KEY_NAME.encode() and value.strip():
            return value.decode(errors="replace").strip()
    return ""


def key_location(environ_file: str) -> str:
    """"environment", "process 1" or "absent"."""
    if os.environ.get(KEY_NAME, "").strip():
        return "environment"
    return "process 1" if key_in_environ_file(environ_file) else "absent"


def write_state(workspace: str, **fields: Any) -> None:
    """Replace the node's state record (atomically: a reader never sees half of one), with this process's pid."""
    path = os.path.join(workspace, STATE_DIR, "state.json")
    with open(path + ".tmp", "w") as f:
        json.dump(dict(fields, pid=os.getpid()), f)
    os.replace(path + ".tmp", path)


def idle_seconds(workspace: str, now: float) -> "float | None":
    """Seconds since training ended or the last pull, whichever came later; None while training runs."""
    ended = os.path.join(workspace, "exit_code")
    if not os.path.exists(ended):
        return None
    marks = [os.path.getmtime(p) for p in (ended, os.path.join(workspace, STATE_DIR, "pulled")) if os.path.exists(p)]
    return now - max(marks)


def stop_key(workspace: str, source: str, environ_file: str) -> str:
    """The key the machine is stopped with, read now ("" when the container's key is gone)."""
    if source == "container":
        return os.environ.get(KEY_NAME, "").strip() or key_in_environ_file(environ_file)
    with open(os.path.join(workspace, STATE_DIR, "key")) as f:
        return f.read().strip()


def stop_instance(api_url: str, instance_id: int, key: str, urlopen: "Callable[..., Any]" = urllib.request.urlopen,
                  sleep: "Callable[[float], None]" = time.sleep) -> "str | None":
    """Ask the API to stop the instance, retrying what may pass (no answer, 429, 5xx) with a growing pause;
    None once stopped, else why not."""
    request = urllib.request.Request(f"{api_url.rstrip('/')}/api/v0/instances/{instance_id}/",  # noqa: S310 - the API's
                                     data=b'{"state": "stopped"}', method="PUT",  # URL, as run.json records it
                                     headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    for attempt in range(STOP_ATTEMPTS):
        try:
            urlopen(request, timeout=30).read()
            return None
        except urllib.error.HTTPError as e:
            if e.code not in RETRIED_STATUSES:
                return f"HTTP {e.code}"
        except OSError:
            pass
        sleep(min(60.0, 2.0 ** attempt))
    return "no answer from the API"


def watch(argv: "list[str]", detach: "Callable[[str], None]", clock: "Callable[[], float]" = time.time,
          sleep: "Callable[[float], None]" = time.sleep,
          urlopen: "Callable[..., Any]" = urllib.request.urlopen) -> int:
    """The watchdog (argv: WORKSPACE API_URL INSTANCE_ID IDLE_S POLL_S [SOURCE [ENVIRON_FILE]]): 0 once the
    machine is stopped or the API never answered, 1 when the stop was refused or the key is gone."""
    workspace, api_url, instance_id = argv[0], argv[1], int(argv[2])
    idle, poll = float(argv[3]), float(argv[4])
    source = argv[5] if len(argv) > 5 else "scoped"
    environ_file = argv[6] if len(argv) > 6 else "/proc/1/environ"
    os.makedirs(os.path.join(workspace, STATE_DIR), mode=0o700, exist_ok=True)  # a container key needs no file
    detach("watching")
    write_state(workspace, state="watching", since=clock())
    while True:
        sleep(poll)
        waited = idle_seconds(workspace, clock())
        if waited is None or waited < idle:
            continue
        key = stop_key(workspace, source, environ_file)
        if not key:
            write_state(workspace, state="failed", error="CONTAINER_API_KEY is gone from the instance")
            return 1
        error = stop_instance(api_url, instance_id, key, urlopen, sleep)
        if error is None:
            write_state(workspace, state="stopped", stopped_at=clock())
            return 0
        write_state(workspace, state="failed", error=error)
        return 0 if error == "no answer from the API" else 1


def main(argv: "list[str]", detach: "Callable[[str], None] | None" = None) -> int:
    if argv[:1] == ["where"] and len(argv) == 2:
        print(key_location(argv[1]))
        return 0
    if argv[:1] == ["watch"] and 6 <= len(argv) <= 8 and detach is not None:
        return watch(argv[1:], detach)
    print("usage: where ENVIRON_FILE | watch WORKSPACE API_URL INSTANCE_ID IDLE_S POLL_S "
          "[SOURCE [ENVIRON_FILE]] (watch: sent after launcher/remote/daemon.py)", file=sys.stderr)
    return 2


if __name__ == "__main__":  # `python -c [DAEMON_SOURCE+]SOURCE OP ARGS...` on the node
    sys.exit(main(sys.argv[1:], globals().get("detach")))
