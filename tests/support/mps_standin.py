"""A stand-in for ``nvidia-cuda-mps-control`` that tests write to disk and the supervisor runs.

It behaves like the real control program where the node agent depends on it:

- ``-d``: forks into the background (setsid, second fork, stdio on /dev/null) and returns 0 at
  once; the daemon writes ``nvidia-cuda-mps-control.pid`` in ``$CUDA_MPS_PIPE_DIRECTORY``, creates
  its command FIFO there, writes ``control.log`` in ``$CUDA_MPS_LOG_DIRECTORY`` and, with
  ``STANDIN_SHM_MARKER=1``, a marker file in its ``/dev/shm`` (so a test can see which /dev/shm it
  had; only where that is a private one: a killed daemon leaves it behind), then serves commands until
  ``quit`` (or SIGTERM), removing its pid file, FIFO and marker on the way out;
- no argument: the control client. It sends its stdin's commands to the daemon of
  ``$CUDA_MPS_PIPE_DIRECTORY`` and exits 1 with a message when no daemon serves that directory;
  ``get_server_list`` prints the servers listed in ``standin-servers`` there (the daemon writes
  them when the fake PyTorch of tests/support/fake_gpu.py registers on its FIFO).

Every start, command and exit is appended as one JSON line to ``<script>.record``. Environment
knobs for failure tests: ``STANDIN_FAIL=start`` (``-d`` fails with a message), ``STANDIN_FAIL=vanish``
(``-d`` succeeds but no daemon stays), ``STANDIN_FAIL=nopid`` (the daemon runs but writes no pid
file and serves no commands), ``STANDIN_IGNORE_QUIT=1`` (the daemon ignores ``quit``).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from pathlib import Path

NAME = "nvidia-cuda-mps-control"

SCRIPT = r"""
import errno, json, os, signal, sys, time

RECORD = __file__ + ".record"
PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
LOG = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
FIFO = os.path.join(PIPE, "control")
PID_FILE = os.path.join(PIPE, "nvidia-cuda-mps-control.pid")


def record(event, **fields):
    shm = os.stat("/dev/shm")
    doc = {"event": event, "pid": os.getpid(), "argv": sys.argv[1:], "pipe": PIPE, "log": LOG,
           "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "shm": [shm.st_dev, shm.st_ino], **fields}
    with open(RECORD, "a") as f:
        f.write(json.dumps(doc) + "\n")


def daemon():
    marker = "/dev/shm/kubegpu-standin-%d" % os.getpid()

    def leave(*_):
        for path in (PID_FILE, FIFO, marker):
            try:
                os.unlink(path)
            except OSError:
                pass
        record("exit")
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    os.mkfifo(FIFO)
    if os.environ.get("STANDIN_SHM_MARKER") == "1":
        with open(marker, "w") as f:
            f.write(PIPE + "\n")
    with open(os.path.join(LOG, "control.log"), "a") as f:
        f.write("standin control daemon %d serving %s\n" % (os.getpid(), PIPE))
    record("started")  # before the pid file: once that is there, the daemon counts as started
    if os.environ.get("STANDIN_FAIL") != "nopid":
        with open(PID_FILE + ".tmp", "w") as f:
            f.write("%d\n" % os.getpid())
        os.rename(PID_FILE + ".tmp", PID_FILE)
    if os.environ.get("STANDIN_FAIL") == "nopid":
        time.sleep(60)
        leave()
    while True:
        with open(FIFO) as f:
            for line in f:
                command = line.strip()
                if not command:
                    continue
                if command.startswith("register_server "):  # from the fake PyTorch (fake_gpu.py)
                    with open(os.path.join(PIPE, "standin-servers"), "a") as servers:
                        servers.write(command.split()[1] + "\n")
                    continue
                record("command", command=command)
                if command == "quit" and os.environ.get("STANDIN_IGNORE_QUIT") != "1":
                    leave()


def main():
    if sys.argv[1:] == ["-d"]:
        if os.environ.get("STANDIN_FAIL") == "start":
            sys.stderr.write("standin: cannot start: STANDIN_FAIL=start\n")
            sys.exit(1)
        if not os.path.isdir(PIPE) or not os.path.isdir(LOG):
            sys.stderr.write("standin: pipe or log directory missing\n")
            sys.exit(1)
        if os.fork():
            os._exit(0)
        os.setsid()
        if os.fork():
            os._exit(0)
        if os.environ.get("STANDIN_FAIL") == "vanish":
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        daemon()
        return
    if sys.argv[1:]:
        sys.stderr.write("standin: unknown arguments %r\n" % sys.argv[1:])
        sys.exit(2)
    commands = [line.strip() for line in sys.stdin if line.strip()]
    record("client", commands=commands)
    try:
        fd = os.open(FIFO, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENXIO):
            sys.stderr.write("Cannot find MPS control daemon process\n")
            sys.exit(1)
        raise
    with os.fdopen(fd, "w") as f:
        for command in commands:
            f.write(command + "\n")
    if "get_server_list" in commands:  # servers the fake torch says it reached (tests/support/fake_gpu.py)
        try:
            with open(os.path.join(PIPE, "standin-servers")) as f:
                sys.stdout.write("".join(sorted(set(f))))
        except OSError:
            pass


main()
"""


def write_standin(directory: Path) -> Path:
    """Write the stand-in as ``directory/nvidia-cuda-mps-control`` (executable); return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / NAME
    path.write_text(f"#!{sys.executable}\n{SCRIPT}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def records(path: Path) -> list[dict[str, object]]:
    """What the stand-in at ``path`` recorded, oldest first."""
    record = Path(str(path) + ".record")
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def events(path: Path, event: str) -> list[dict[str, object]]:
    return [r for r in records(path) if r["event"] == event]


def os_pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def kill_started(path: Path, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to each daemon the stand-in at ``path`` started that still runs: nothing may
    outlive the test that started it."""
    for started in events(path, "started"):
        pid = int(started["pid"])  # type: ignore[call-overload]
        if os_pid_alive(pid):
            os.kill(pid, sig)
