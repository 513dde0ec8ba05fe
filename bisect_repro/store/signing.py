"""Who recorded a run: the recorder signs what it writes about the launch, with this user's key.

``compare`` replays a run by running the code its ``run.json`` names, so a run directory handed
over by someone else must not decide what runs on this machine. The recorder signs the *launch
claim* (:func:`launch_claim`: the target, the config, the launch record, the environment
variables and the distributed layout: everything that decides what a replay runs) with
HMAC-SHA256 under a key kept in this user's configuration folder
(``$XDG_CONFIG_HOME/bisect-repro/signing.key``, else ``~/.config/...``), created on first use
with mode 0600. A run whose claim verifies under that key was recorded by this user on this
machine (or one sharing the key) and replays with no flag; any other run (copied from another
user, edited, unsigned) replays only with the user's consent, as ``weights_only`` and
``trust_remote_code`` decide elsewhere in this ecosystem.

Each index line is signed too (:func:`line_signer`, :func:`verify_line`): a MAC over the line
(a file's name, size and checksum) bound to the run's own signature and the rank, so that what a
replay restores from a checkpoint is covered as the launch is (:mod:`bisect_repro.store.trust`).
When no key can sign, :func:`key_problem` says why in one line with the fix, which ``record``
prints as a warning.

Design decisions:
- A MAC, not a public-key signature: the only party that ever verifies is the one that signed.
- The claim is canonical JSON (sorted keys, no spaces, ASCII) of values as a JSON reader sees
  them, so what is signed at write time is what is checked at read time.
- The key file is trusted only when it is a regular file owned by this user and readable by
  nobody else; otherwise nothing verifies (every run needs consent) and nothing is signed.

Where the guarantees stop: the signature says who wrote the launch claim, not that the code it
names is harmless: the code is still checked against its recorded SHA-256 before it runs
(:mod:`bisect_repro.replay.launch`). Anyone who can read the key file can forge a signature;
keep it as private as an SSH key. A run recorded before signing existed needs consent once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "key_path",
    "key_problem",
    "launch_claim",
    "line_mac",
    "line_signer",
    "sign",
    "verify",
    "verify_line",
]

_KEY_BYTES = 32
_CLAIM_KEYS = ("target", "config", "launch", "distributed")


def key_path() -> Path:
    """Where this user's signing key lives."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "bisect-repro" / "signing.key"


def launch_claim(meta: Mapping[str, Any]) -> bytes:
    """The canonical bytes of what decides a replay: target, config, launch, variables, layout."""
    claim = {key: meta.get(key) for key in _CLAIM_KEYS}
    environment = meta.get("environment")
    if not isinstance(environment, dict):
        environment = {}
    claim["variables"] = {
        k: v for k, v in environment.items() if isinstance(k, str) and k.startswith("env.")
    }
    return json.dumps(
        claim, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True
    ).encode()


def _read_key(path: Path) -> bytes | None:
    """The key, if the file is this user's own regular file that nobody else can read."""
    try:
        handle = os.open(
            path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        )
    except OSError:
        return None
    try:
        info = os.fstat(handle)
        private = stat.S_ISREG(info.st_mode) and info.st_mode & 0o077 == 0
        if not private or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
            return None
        key = bytes.fromhex(os.read(handle, 4 * _KEY_BYTES).decode("ascii", "replace").strip())
    except (OSError, ValueError):
        return None
    finally:
        os.close(handle)
    return key if len(key) == _KEY_BYTES else None


def _create_key(path: Path) -> bytes | None:
    """A new key, mode 0600, appearing under its name only whole: written to a private temporary
    file, then hard-linked into place, which fails if another process linked its key first (that
    key then wins, and is read)."""
    key = secrets.token_bytes(_KEY_BYTES)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(handle, key.hex().encode() + b"\n")
            os.fsync(handle)
        finally:
            os.close(handle)
        os.link(temporary, path)
    except FileExistsError:
        return _read_key(path)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return key


def key_problem() -> str | None:
    """Why this user's key cannot sign (one line with the fix), or ``None`` when it can."""
    path = key_path()
    if not path.exists() and not path.is_symlink():
        return (
            None
            if _create_key(path) is not None
            else f"{path}: cannot be created; make its folder writable by you"
        )
    if _read_key(path) is not None:
        return None
    try:
        info = os.lstat(path)
    except OSError as error:
        return f"{path}: cannot be read ({error.strerror}); fix its permissions (chmod 600)"
    if not stat.S_ISREG(info.st_mode):
        return f"{path}: is not a regular file; remove it, and a new key is made on the next record"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"{path}: is not yours; remove it, and a new key is made on the next record"
    if info.st_mode & 0o077:
        return (
            f"{path}: can be read by others (mode {stat.S_IMODE(info.st_mode):o}); run chmod "
            "600 on it (or remove it for a new key)"
        )
    return f"{path}: is not a key; remove it, and a new key is made on the next record"


def _line_claim(run_mac: str, rank: int, line: Mapping[str, Any]) -> bytes:
    claim = {"run": run_mac, "rank": rank, "line": {k: v for k, v in line.items() if k != "mac"}}
    return json.dumps(
        claim, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True
    ).encode()


def line_mac(key: bytes, run_mac: str, rank: int, line: Mapping[str, Any]) -> str:
    """The MAC of one index line of rank ``rank``, bound to the run's own signature ``run_mac``."""
    return hmac.new(
        key, b"bisect-repro index line\0" + _line_claim(run_mac, rank, line), hashlib.sha256
    ).hexdigest()


def line_signer(meta: Mapping[str, Any], rank: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """What adds this user's MAC to each index line a writer of ``meta``'s run writes: the identity
    (no MAC) unless ``meta`` carries this user's valid signature, so that no line of a run this
    user did not sign is ever signed."""
    key = _read_key(key_path())
    signature = meta.get("signature")
    if key is None or not verify(meta):
        return dict
    run_mac = signature["mac"]  # type: ignore[index]  # verify() checked it
    return lambda line: {**line, "mac": line_mac(key, run_mac, rank, line)}


def verify_line(meta: Mapping[str, Any], rank: int, line: Mapping[str, Any], mac: object) -> bool:
    """Whether ``mac`` is this user's MAC over ``line`` of rank ``rank`` of the run ``meta``
    describes."""
    key = _read_key(key_path())
    signature = meta.get("signature")
    if (
        key is None
        or not isinstance(mac, str)
        or not isinstance(signature, dict)
        or not isinstance(signature.get("mac"), str)
    ):
        return False
    return hmac.compare_digest(line_mac(key, signature["mac"], rank, line), mac)


def _key_id(key: bytes) -> str:
    return hashlib.sha256(b"bisect-repro key id\0" + key).hexdigest()[:16]


def sign(meta: Mapping[str, Any]) -> dict[str, str] | None:
    """``run.json``'s ``signature`` for ``meta`` (creating this user's key on first use); ``None``
    when no private key can be had (the run is then replayed only with consent)."""
    path = key_path()
    key = _read_key(path) if path.exists() else _create_key(path)
    if key is None:
        return None
    return {
        "key": _key_id(key),
        "mac": hmac.new(key, launch_claim(meta), hashlib.sha256).hexdigest(),
    }


def verify(meta: Mapping[str, Any]) -> bool:
    """Whether ``meta``'s signature is this user's over its launch claim as it is now."""
    signature = meta.get("signature")
    key = _read_key(key_path())
    if key is None or not isinstance(signature, dict) or not isinstance(signature.get("mac"), str):
        return False
    expected = hmac.new(key, launch_claim(meta), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature["mac"])
