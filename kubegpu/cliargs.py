"""What every ``kubegpu`` subcommand shares on its command line: value types that name the problem,
a parser whose usage errors are one line, and the error boundary a command runs inside.

Exit statuses (docs/errors.md): 0 done; 1 a runtime failure (a service that cannot be reached or
refuses, an address that cannot be listened on, a file that cannot be written); 2 a usage error
(a flag value, a missing, unreadable or malformed file named on the command line). Whatever goes
wrong, stderr gets exactly one line, ``kubegpu <command>: <flag or file>: <problem>``; the
traceback only with ``kubegpu --log-level debug``.

A command raises ``UsageError`` or ``Failure`` (or a subclass) with a message naming the flag or
file; ``run_command`` also turns the usual escapes of the libraries underneath (a kubeconfig the
Kubernetes client cannot load, an API server that cannot be reached or answers an error, an
``OSError`` naming a file) into their one line. This module imports nothing heavy: the value
types run while the command line is parsed, before any command's imports.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
import socket
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

from kubegpu import inputfiles

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
MAX_MESSAGE = 800  # characters of one error line (a huge API answer must not flood the terminal)
MAX_SECONDS = 7 * 24 * 3600.0  # no interval or timeout of kubegpu's makes sense beyond a week
UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"^{DNS_LABEL}(\.{DNS_LABEL})*$")
HOSTNAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$")
_DURATION = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class CommandError(Exception):
    """A command cannot go on; the message names the flag or file and the problem."""

    status = EXIT_FAILURE


class UsageError(CommandError):
    """A flag value, or a file named on the command line, is wrong: exit status 2."""

    status = EXIT_USAGE


class Failure(CommandError):
    """The command was well formed but could not do its work: exit status 1."""

    status = EXIT_FAILURE


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` on one line: every run of whitespace (newlines included) becomes one space."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def report(prog: str, message: str) -> None:
    """Write the one line ``prog: message`` to stderr."""
    print(f"{prog}: {one_line(message)}", file=sys.stderr, flush=True)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr and exit status 2.

    Subparsers made with ``add_subparsers`` are of this class too (argparse's default).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


def set_progs(parser: argparse.ArgumentParser) -> None:
    """Record in every (sub)parser's defaults the ``prog`` its errors are reported under."""
    parser.set_defaults(command_prog=parser.prog)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                set_progs(sub)


# ---------------------------------------------------------------------------------------- value types


def _type(name: str, check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type``: argparse prefixes its messages with ``argument --flag:``."""

    def convert(text: str) -> Any:
        try:
            return check(text)
        except argparse.ArgumentTypeError:
            raise
        except (ValueError, TypeError, OverflowError) as error:
            raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None

    convert.__name__ = name
    return convert


def parse_seconds(text: str) -> float:
    """``10``, ``2.5``, ``500ms``, ``10s``, ``5m``, ``1h`` -> seconds; ValueError if not a duration."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError("not a duration (want seconds, or a number with ms, s, m or h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def duration(allow_zero: bool = False, maximum: float = MAX_SECONDS) -> Callable[[str], float]:
    """Seconds: more than 0 (or at least 0 with ``allow_zero``), finite, at most ``maximum``."""

    def check(text: str) -> float:
        seconds = parse_seconds(text)
        if not math.isfinite(seconds):
            raise ValueError("not a finite duration")
        if seconds < 0 or (seconds == 0 and not allow_zero):
            raise ValueError(f"must be {'0 or more' if allow_zero else 'more than 0'} seconds")
        if seconds > maximum:
            raise ValueError(f"must be at most {maximum:g} seconds")
        return seconds

    return _type("duration", check)


def number(
    minimum: float = 0.0, maximum: float = math.inf, inclusive: bool = False
) -> Callable[[str], float]:
    """A finite real number above ``minimum`` (or at it with ``inclusive``), at most ``maximum``."""

    def check(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError("not a finite number")
        if value < minimum or (value == minimum and not inclusive):
            raise ValueError(f"must be {'at least' if inclusive else 'more than'} {minimum:g}")
        if value > maximum:
            raise ValueError(f"must be at most {maximum:g}")
        return value

    return _type("number", check)


def count(minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """A whole number in ``[minimum, maximum]``: ASCII digits only (``int()`` would also take
    ``1_0``, a sign and other scripts' digits)."""

    def check(text: str) -> int:
        digits = text.strip()
        if not (digits and digits.isascii() and digits.isdigit()):
            raise ValueError("not a whole number")
        value = int(digits, 10)
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be at most {maximum}")
        return value

    return _type("count", check)


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?)?B?\s*$")
_SIZE_UNITS = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
               "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_size(text: str) -> int:
    """``4096``, ``512Mi``, ``4Gi``, ``2G`` (Kubernetes' suffixes) -> bytes; ValueError otherwise."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError("not a size (want bytes, or a whole number with Ki, Mi, Gi, Ti, K, M, G or T)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def size(minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """A size in bytes in ``[minimum, maximum]``, with an optional Kubernetes suffix."""

    def check(text: str) -> int:
        value = parse_size(text)
        if value < minimum:
            raise ValueError(f"must be at least {minimum} bytes")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be at most {maximum} bytes")
        return value

    return _type("size", check)


def _check_host(host: str) -> None:
    if not host:
        return
    if host.startswith("[") and host.endswith("]"):
        ipaddress.IPv6Address(host[1:-1])  # ValueError names the problem
        return
    if ":" in host:
        raise ValueError("an IPv6 address must be in brackets, as [::1]:9464")
    if len(host) > 253 or not HOSTNAME.match(host):
        raise ValueError(f"{host!r} is not a host name or IP address")


WILDCARD_HOSTS = ("", "0.0.0.0", "::")  # listening hosts that name no one host to reach ("": loopback)


def split_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``:PORT`` -> (host without brackets, port)."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep:
        raise ValueError("want HOST:PORT")
    _check_host(host)
    if not port_text.isdigit():
        raise ValueError(f"port {port_text!r} is not a number")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port {port} is out of range (0-65535)")
    return host.strip("[]"), port


def listen_address(text: str) -> str:
    """An argparse type: ``HOST:PORT`` to listen on (port 0: any free port); returned unchanged."""

    def check(value: str) -> str:
        split_host_port(value)
        return value.strip()

    return _type("address", check)(text)


def check_listen(flag: str, address: str, default_host: str = "127.0.0.1") -> None:
    """Raise ``Failure`` naming ``flag`` when nothing can listen on ``address`` now."""
    host, port = split_host_port(address)
    host = host or default_host
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, sockaddr = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(sockaddr)
    except OSError as error:
        raise Failure(f"{flag} {address}: cannot listen there: {error.strerror or error}") from None


def unix_endpoint(text: str) -> str:
    """An argparse type: ``unix:///path``, ``unix:/path`` or ``/path``, absolute; returned unchanged."""

    def check(value: str) -> str:
        path = value
        for prefix in ("unix://", "unix:"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
                break
        else:
            if "://" in value:
                raise ValueError("want a unix socket: unix:///path or /path")
        if not path.startswith("/"):
            raise ValueError("want a unix socket with an absolute path: unix:///path or /path")
        if "\0" in path:
            raise ValueError("the path holds a NUL byte")
        if len(path.encode()) > UNIX_PATH_MAX:
            raise ValueError(f"the socket path is longer than {UNIX_PATH_MAX} bytes")
        return value

    return _type("endpoint", check)(text)


def _subdomain(what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if len(value) > 253 or not DNS_SUBDOMAIN.match(value):
            raise ValueError(f"not a {what} (lowercase letters, digits, '-' and '.'; at most 253)")
        return value

    return _type(what, check)


node_name = _subdomain("Kubernetes node name")
node_name.__doc__ = "An argparse type: a Node name (a lowercase DNS subdomain); returned unchanged."
dns_subdomain = _subdomain("DNS subdomain")
dns_subdomain.__doc__ = "An argparse type: a lowercase DNS subdomain (object names); returned unchanged."


def _two_digits(value: str) -> str:
    if not (len(value) == 2 and value.isascii() and value.isdigit()):
        raise ValueError("want two ASCII digits, 00 to 99")
    return value


two_digits = _type("two digits", _two_digits)
two_digits.__doc__ = "An argparse type: two ASCII digits (an NRI plugin index); returned unchanged."


def input_file(limit: int = inputfiles.MAX_INPUT_BYTES) -> Callable[[str], Path]:
    """An argparse type: a regular file (symlinks followed) of at most ``limit`` bytes we may read.

    Judged from ``stat`` alone: a FIFO, a device such as ``/dev/zero`` or a directory is refused
    without being opened (kubegpu/inputfiles.py).
    """

    def check(value: str) -> Path:
        try:
            return inputfiles.check_input(value, limit)
        except inputfiles.InputFileError as error:
            raise argparse.ArgumentTypeError(f"{value}: {error.problem}") from None

    return _type("file", check)


readable_file = input_file()
readable_file.__doc__ = "An argparse type: a regular file of at most 16 MiB we may read; returns its Path."


def directory(text: str) -> str:
    """An argparse type: an existing directory; returned unchanged."""
    path = Path(text)
    if not path.is_dir():
        problem = "Not a directory" if path.exists() else "No such directory"
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return text


def absent_or_directory(text: str) -> Path:
    """An argparse type: a directory, or a path not made yet (state dirs, key dirs); returns its Path."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    path = Path(text)
    try:
        path.stat()
    except FileNotFoundError:
        return path
    except OSError as error:
        raise argparse.ArgumentTypeError(f"{text}: {error.strerror or error}") from None
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: Not a directory")
    return path


def output_file(text: str) -> Path:
    """An argparse type: a file to write: not a directory, in a directory that exists."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: Is a directory")
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: No such directory {path.absolute().parent}")
    return path


def one_of(names: Callable[[], Iterable[str]], what: str) -> Callable[[str], str]:
    """An argparse type: one of ``names()`` (called only when the flag is parsed)."""

    def check(value: str) -> str:
        known = list(names())
        if value not in known:
            raise argparse.ArgumentTypeError(f"unknown {what} {value!r} (known: {', '.join(known)})")
        return value

    check.__name__ = what
    return check


def parsed_by(parse: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """An argparse type from a parser raising ValueError: the message says what was wanted."""

    def check(value: str) -> Any:
        try:
            return parse(value)
        except (ValueError, OverflowError) as error:
            raise argparse.ArgumentTypeError(f"{value!r}: {error} (want {what})") from None

    check.__name__ = what
    return check


# ---------------------------------------------------------------------------------- error boundary


def _instance(error: BaseException, module: str, name: str) -> bool:
    """``isinstance(error, module.name)`` without importing ``module`` (a raiser has loaded it)."""
    loaded = sys.modules.get(module)
    cls = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(cls, type) and isinstance(error, cls)


def api_status_message(error: Any) -> str:
    """A Kubernetes ApiException on one line: ``<status> <reason>: <the Status message>``."""
    import json

    detail = ""
    try:
        body = json.loads(error.body or "")
        detail = str(body.get("message", "")) if isinstance(body, dict) else ""
    except (ValueError, TypeError):
        detail = str(error.body or "")[:200]
    text = f"{error.status} {error.reason or ''}".strip()
    return f"{text}: {detail}" if detail else text


def explain(error: BaseException) -> tuple[int, str]:
    """The exit status and the one-line message for an exception that ended a command."""
    if isinstance(error, CommandError):
        return error.status, str(error)
    if _instance(error, "kubernetes.config.config_exception", "ConfigException"):
        return EXIT_USAGE, f"kubeconfig: {error}"
    if _instance(error, "kubernetes.client.exceptions", "ApiException"):
        if not getattr(error, "status", None):  # the client's wrapping of a TLS failure
            return EXIT_FAILURE, f"cannot reach the API server: {getattr(error, 'reason', error)}"
        return EXIT_FAILURE, f"the API server answered {api_status_message(error)}"
    if _instance(error, "urllib3.exceptions", "MaxRetryError"):
        reason = getattr(error, "reason", None) or error
        return EXIT_FAILURE, f"cannot reach {getattr(error, 'url', '') or 'the server'}: {_reason(reason)}"
    if _instance(error, "urllib3.exceptions", "HTTPError"):
        return EXIT_FAILURE, f"cannot reach the server: {_reason(error)}"
    if isinstance(error, OSError) and error.filename is not None:
        return EXIT_FAILURE, f"{error.filename}: {error.strerror or error}"
    if isinstance(error, OSError):
        return EXIT_FAILURE, f"{error.strerror or error}"
    name = type(error).__name__
    return EXIT_FAILURE, f"unexpected {name}: {error} (kubegpu --log-level debug shows where)"


def _reason(error: BaseException) -> str:
    """The root cause of a urllib3 error, without urllib3's object reprs."""
    text = str(error)
    # "<urllib3.connection.HTTPSConnection object at 0x...>: Failed to establish a new connection: ..."
    text = re.sub(r"<[^<>]* object at 0x[0-9a-f]+>:?\s*", "", text)
    return text or type(error).__name__


def run_command(prog: str, command: Callable[[], int | None], debug: bool = False) -> int:
    """Run ``command`` and return its exit status; whatever escapes it becomes one stderr line.

    With ``debug`` the traceback is printed before that line.
    """
    try:
        return int(command() or EXIT_OK)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        report(prog, "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout's reader went away (``kubegpu simulate | head``): not an error worth a line.
        _silence_stdout()
        return EXIT_FAILURE
    except Exception as error:
        status, message = explain(error)
        if debug:
            traceback.print_exc()
        report(prog, message)
        return status


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
