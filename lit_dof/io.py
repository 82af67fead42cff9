"""Atomic writes: a killed process never leaves a half-written file or directory behind (the brief's rule); and
what records carry: library versions (:func:`library_versions`) and commands without this machine's paths
(:func:`portable`).

A writer killed mid-write (SIGKILL, a lost node) leaves its temporary next to the target:
``.<name>.tmp-<host>-<pid>-<random>`` (a folder of :func:`atomic_directory`, a file of :func:`atomic_file`), or,
killed between the two renames of :func:`atomic_directory`, the previous complete directory as
``.<name>.old-<host>-<pid>-<random>``. The next save to the same target removes the ones of this host whose process is
gone (:func:`abandoned_siblings`): temporaries before it writes, old directories once its own directory is in place
(before that an old directory may be the only complete copy). Other hosts' (a shared filesystem under multi-node
training: their pids mean nothing here) and live processes' are left alone, and so are the older names without a
host and pid (``.<name>.tmp-<random>``, ``.<name>.old-<pid>``, ``.<name>.<random>``), whose writer cannot be told
alive or dead: delete those by hand when no lit-dof process writes there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The repository's root (the folder holding ``lit_dof/`` and ``configs/``)."""


def _umask() -> int:
    """The process's file-mode creation mask (read by setting and restoring it; POSIX has no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _plain_mode(target: Path, directory: bool) -> int:
    """The permissions ``open``/``mkdir`` would have given ``target``: those of the file it replaces, else
    ``0o666`` (files) or ``0o777`` (directories) less the umask. ``mkstemp``/``mkdtemp`` create ``0o600`` /
    ``0o700`` (private), which would hide reports and exported students from the rest of a shared group."""
    if target.exists() and target.is_dir() == directory:
        return stat.S_IMODE(target.stat().st_mode)
    return (0o777 if directory else 0o666) & ~_umask()


def host_tag() -> str:
    """This machine's process table as a file-name word: the host name (characters other than letters, digits,
    ``.`` and ``_`` as ``_``) and, on Linux, the PID namespace (``vm+4026531836``), so that containers sharing a
    host name but not their PIDs count as different hosts.

    Returns:
        the tag, without ``-`` (temporary names use it as their separator).
    """
    tag = re.sub(r"[^A-Za-z0-9._]", "_", socket.gethostname()) or "host"
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return tag
    inode = re.sub(r"\D", "", namespace)
    return f"{tag}+{inode}" if inode else tag


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (``os.kill(pid, 0)``); anything but "no such process" counts as
    alive (another user's process, an error), so that nothing of a live writer is ever removed."""
    if pid <= 0:  # 0 and negative pids name process groups
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _temporary_prefix(target: Path, kind: str) -> str:
    """``.<name>.<kind>-<host>-<pid>-``: the start of this process's temporary names for ``target``."""
    return f".{target.name}.{kind}-{host_tag()}-{os.getpid()}-"


def abandoned_siblings(target: str | os.PathLike, kind: str = "tmp") -> list[Path]:
    """The temporaries of ``target`` that a dead process of this host left: its siblings named
    ``.<name>.<kind>-<host>-<pid>-<random>`` with this host's :func:`host_tag` and the pid of no running process.

    Args:
        target: the file or directory the temporaries were for.
        kind: ``"tmp"`` (the temporary being written) or ``"old"`` (a replaced directory awaiting deletion).

    Returns:
        their paths (none when the folder does not exist); other hosts', live processes' and names without a host
        and pid are never among them.
    """
    target = Path(target)
    prefix = f".{target.name}.{kind}-{host_tag()}-"
    try:
        entries = list(os.scandir(target.parent))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        rest = entry.name[len(prefix) :] if entry.name.startswith(prefix) else ""
        match = re.fullmatch(r"(\d+)-[A-Za-z0-9_]+", rest)  # pid, then mkstemp's random part (no "-")
        if match and not _process_alive(int(match.group(1))):
            found.append(Path(entry.path))
    return found


def _remove(path: Path) -> None:
    """Delete a file or a directory tree; one already gone (another writer cleaning up) is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary directory next to ``path``; on success it replaces ``path``.

    The new directory is renamed into place (an existing ``path`` is first renamed aside and then deleted),
    so readers see either the old complete directory or the new complete one. On an exception the
    temporary directory is removed and ``path`` is untouched. The new directory gets the permissions of the
    one it replaces, else those ``mkdir`` would give it (not ``mkdtemp``'s private ``0o700``). What killed writers of
    this host left for ``path`` is removed: their temporaries first, their replaced directories after the rename
    (:func:`abandoned_siblings`).

    Args:
        path: the directory to write (its folder is created).

    Yields:
        The temporary directory to fill.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in abandoned_siblings(target, "tmp"):
        _remove(stale)
    prefix = _temporary_prefix(target, "tmp")
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        os.chmod(tmp, _plain_mode(target, directory=True))
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if target.exists():
        old = target.parent / (_temporary_prefix(target, "old") + tmp.name[len(prefix) :])
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    for stale in abandoned_siblings(target, "old"):  # only now: an old directory may have been the only copy
        _remove(stale)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, binary: bool = True) -> Iterator[IO]:
    """Yield a handle on a temporary file next to ``path``; on success it replaces ``path``.

    The handle is flushed and synced, then renamed over ``path`` with ``os.replace``, so readers see either the
    old complete file or the new complete one. On an exception the temporary file is removed and ``path`` is
    untouched. The file keeps the permissions of the one it replaces, else gets those ``open`` would give it
    (not ``mkstemp``'s private ``0o600``). Temporaries that killed writers of this host left for ``path`` are removed
    first (:func:`abandoned_siblings`).

    Args:
        path: the file to write (its folder is created).
        binary: a binary handle (``torch.save``, ``savefig``); else a UTF-8 text handle.

    Yields:
        The open handle.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in abandoned_siblings(target, "tmp"):
        _remove(stale)
    fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(target, "tmp"), dir=target.parent)
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), _plain_mode(target, directory=False))
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_file`).

    Args:
        path: the file to write (its folder is created).
        data: its whole content.
    """
    with atomic_file(path) as handle:
        handle.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_file`).

    Args:
        path: the file to write (its folder is created).
        text: its whole content.
    """
    with atomic_file(path, binary=False) as handle:
        handle.write(text)


def atomic_write_json(path: str | os.PathLike, payload) -> None:
    """:func:`atomic_write_text` of ``json.dumps(payload, indent=2)``."""
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


CORE_PACKAGES = ("torch", "transformers", "lit_dof")
"""The libraries whose versions every DoF and hybrid record carries."""


def library_versions(packages: Sequence[str] = CORE_PACKAGES) -> dict[str, str | None]:
    """The installed versions of ``packages``, for the records a measurement writes.

    Args:
        packages: distribution names (``"lit-dof"`` and ``"lit_dof"`` both work); the keys of the result.

    Returns:
        ``{name: version}`` in the order given: the distribution's version (``importlib.metadata``), else the
        ``__version__`` of an already imported module of that name (a checkout on ``sys.path``), else None.
    """
    import importlib.metadata as md

    versions: dict[str, str | None] = {}
    for package in packages:
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            module = sys.modules.get(package.replace("-", "_"))
            versions[package] = getattr(module, "__version__", None)
    return versions


def portable(command: Sequence[str]) -> str:
    """A recorded command without this machine's paths.

    Args:
        command: the command's words.

    Returns:
        The words joined by spaces, the interpreter written as ``python``, repository paths relative to its root
        and paths beside the repository as ``../``.
    """
    text = " ".join(command).replace(sys.executable, "python")
    return text.replace(f"{REPO_ROOT}/", "").replace(f"{REPO_ROOT.parent}/", "../")
