"""Files a user names on a command line or in a config: read only regular files, bounded in size.

A path given for a config, kubeconfig, topology, trace or key file may name anything: a FIFO (an
``open`` that blocks forever), ``/dev/zero`` or a symlink to it (a read that never ends), a
directory, or a file of gigabytes. ``check_input`` refuses all of these from ``stat`` alone,
without opening the file; ``read_input`` opens without blocking, checks the open file again and
reads at most ``limit`` bytes. Both raise ``InputFileError`` (an ``OSError``) whose message names
the path and the problem in one line (docs/errors.md).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

MAX_INPUT_BYTES = 16 * 1024 * 1024  # configs, kubeconfigs, topologies: far beyond any real one
MAX_TRACE_BYTES = 1024 * 1024 * 1024  # simulator traces are streamed; this bounds a mistake


class InputFileError(OSError):
    """A named input file that must not be read; ``str()`` is one line naming it."""

    def __init__(self, path: str | os.PathLike[str], problem: str, code: int = errno.EINVAL) -> None:
        super().__init__(code, problem, str(path))
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.filename}: {self.problem}"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISFIFO(mode):
        return "is a FIFO, not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file"
    return "is not a regular file"


def _check(path: str | os.PathLike[str], st: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(path, _kind(st.st_mode))
    if st.st_size > limit:
        raise InputFileError(path, f"{st.st_size} bytes is too large (at most {limit})", errno.EFBIG)


def check_input(path: str | os.PathLike[str], limit: int = MAX_INPUT_BYTES) -> Path:
    """``path`` if it is a regular file (symlinks followed) of at most ``limit`` bytes we may read."""
    try:
        st = os.stat(path)
    except OSError as error:
        raise InputFileError(path, error.strerror or str(error), error.errno or errno.EINVAL) from None
    _check(path, st, limit)
    if not os.access(path, os.R_OK):
        raise InputFileError(path, "Permission denied", errno.EACCES)
    return Path(path)


def read_input(path: str | os.PathLike[str], limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``); never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise InputFileError(path, error.strerror or str(error), error.errno or errno.EINVAL) from None
    try:
        _check(path, os.fstat(fd), limit)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        return read_bounded(handle, limit, str(path))


def read_bounded(handle: BinaryIO, limit: int, name: str = "<stdin>") -> bytes:
    """At most ``limit`` bytes from ``handle`` (stdin may be endless); more is an error naming it."""
    data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputFileError(name, f"more than {limit} bytes", errno.EFBIG)
    return data


def read_text(path: str | os.PathLike[str], limit: int = MAX_INPUT_BYTES) -> str:
    """``read_input`` decoded as UTF-8 (a ``UnicodeDecodeError``, a ``ValueError``, if it is not)."""
    return read_input(path, limit).decode("utf-8")
