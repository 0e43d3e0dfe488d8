"""``kubegpu keys``: make and inspect the allocation signing keys (formats in docs/allocation.md).

- ``generate``: a new Ed25519 private key, PEM PKCS#8 (what ``openssl genpkey -algorithm
  ed25519`` and Helm's ``genPrivateKey "ed25519"`` produce), to stdout or a 0600 file;
- ``public``: the public key of a private key file (or of a public one), PEM or raw base64:
  what the nodes hold;
- ``check``: load a key directory as the shim (default) or the scheduler (``--private``) would,
  print the key ids, and exit 1 if any file was skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kubegpu.inputfiles import read_input

# kubegpu.allocation (and the cryptography package under it) is imported by the actions, not here:
# every ``kubegpu`` command builds this parser, and ``kubegpu devices`` must run on a GPU machine
# that has only the standard library and pynvml (docs/devices.md, "Proof on a real GPU").


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "keys",
        help="generate and inspect allocation signing keys",
        description="Ed25519 keys for the allocation signature: the scheduler holds the private key, "
        "every node the public one (docs/allocation.md).",
    )
    keys = parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    generate = keys.add_parser("generate", help="a new private key (PEM PKCS#8)")
    generate.add_argument("--out", type=Path, help="write it to this file (mode 0600) instead of stdout")
    generate.set_defaults(run=_generate)
    public = keys.add_parser("public", help="the public key of a key file")
    public.add_argument("key", help="private (or public) key file; - for stdin")
    public.add_argument("--format", choices=["pem", "base64"], default="pem", help="default: %(default)s")
    public.set_defaults(run=_public)
    check = keys.add_parser("check", help="load a key directory as the shim or the scheduler would")
    check.add_argument("directory", type=Path)
    check.add_argument("--private", action="store_true", help="as the scheduler: private keys allowed")
    check.set_defaults(run=_check)


def _generate(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from kubegpu.allocation import private_key_pem

    pem = private_key_pem(Ed25519PrivateKey.generate())
    if args.out is None:
        sys.stdout.write(pem.decode())
        return 0
    try:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        print(f"kubegpu keys generate: {args.out}: {error.strerror}", file=sys.stderr)
        return 2
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return 0


def _public(args: argparse.Namespace) -> int:
    from kubegpu.allocation import (
        MAX_KEY_FILE_BYTES,
        KeyFileError,
        parse_key,
        public_key_base64,
        public_key_pem,
    )

    try:
        if args.key == "-":
            data = sys.stdin.buffer.read(MAX_KEY_FILE_BYTES + 1)
        else:
            data = read_input(args.key, MAX_KEY_FILE_BYTES)  # a FIFO or /dev/zero: refused unread
        if len(data) > MAX_KEY_FILE_BYTES:
            raise KeyFileError(f"larger than {MAX_KEY_FILE_BYTES} bytes")
        key = parse_key(data)
    except OSError as error:
        print(f"kubegpu keys public: {args.key}: {error.strerror or error}", file=sys.stderr)
        return 2
    except KeyFileError as error:
        print(f"kubegpu keys public: {args.key}: {error}", file=sys.stderr)
        return 2
    if args.format == "base64":
        print(public_key_base64(key))
    else:
        sys.stdout.write(public_key_pem(key).decode())
    return 0


def _check(args: argparse.Namespace) -> int:
    from kubegpu.allocation import load_keys

    if not args.directory.is_dir():
        print(f"kubegpu keys check: {args.directory} is not a directory", file=sys.stderr)
        return 2
    loaded = load_keys(args.directory, allow_private=args.private)
    report = {
        "verifying": sorted(loaded.public),
        "signing": sorted(loaded.private),
        "skipped": list(loaded.problems),
    }
    print(json.dumps(report, indent=2))
    return 1 if loaded.problems else 0
