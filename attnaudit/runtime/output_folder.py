"""Output folders written whole or not at all.

A command that writes a folder (``report --out``, ``intervene --out``) first calls
:meth:`OutputFolder.check`, before any audit work, so a location that cannot work is
refused at once:

- an empty path, a path naming an existing file or lying under a file, and a folder that
  cannot be written are refused;
- an existing folder is accepted when it is empty or holds an attnaudit output (recognised
  by its ``manifest.json``, see :func:`is_attnaudit_output`), which is then replaced
  whole; a folder holding anything else is refused unless ``force=True``, which replaces
  it whole too.

:meth:`OutputFolder.assembling` then yields a temporary folder beside the target
(``.NAME.attnaudit-XXXX`` in the same parent, so the final move is a rename on one file
system). When the block completes, the previous folder is moved aside, the new one renamed
into place and the old one deleted; when the block raises — an error, Ctrl-C, SIGTERM —
the temporary folder is deleted and the previous output is left as it was, byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from attnaudit.errors import OutputFolderError

MANIFEST = "manifest.json"
_STAGING_PREFIX = ".attnaudit-"



def is_attnaudit_output(folder: Path) -> bool:
    """True when ``folder`` holds a ``manifest.json`` written by attnaudit: a JSON object
    whose ``libraries`` name attnaudit (every report and ``intervene --out`` manifest)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(manifest, dict) and isinstance(manifest.get("libraries"), dict)
            and "attnaudit" in manifest["libraries"])


class OutputFolder:
    """Where one command's output goes; see the module docstring.

    path: the target folder, absolute. force: replace a folder that holds other files.
    """

    def __init__(self, path: Path, force: bool) -> None:
        self.path = path
        self.force = force

    @classmethod
    def check(cls, path: str | Path | None, *, force: bool = False,
              option: str = "--out") -> OutputFolder:
        """Refuse a location that cannot take the output (see the module docstring);
        nothing is created. ``option`` names the setting in messages."""
        if path is None or str(path).strip() == "":
            raise OutputFolderError(f"{option} is empty: give a folder to write to, e.g. "
                                    f"{option} reports/run1")
        folder = cls(Path(os.path.abspath(path)), force)
        folder._check_location(option)
        return folder

    def _check_location(self, option: str) -> None:
        path = self.path
        if path.exists() and not path.is_dir():
            raise OutputFolderError(f"{option} {path} is a file, not a folder: give a folder "
                                    "path (it is created if missing)")
        nearest = path.parent
        while not nearest.exists():
            nearest = nearest.parent
        if not nearest.is_dir():
            raise OutputFolderError(f"{option} {path} lies under {nearest}, which is a file: "
                                    "give a folder path outside it")
        try:  # the real test: create (and remove) a folder where the output will be assembled
            Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=nearest)).rmdir()
        except OSError as exc:
            raise OutputFolderError(f"{option} {path}: cannot write in {nearest} "
                                    f"({exc.strerror or exc}); choose a folder you can write "
                                    "to") from None
        if (path.is_dir() and not self.force and any(path.iterdir())
                and not is_attnaudit_output(path)):
            raise OutputFolderError(
                f"{option} {path} holds files that are not an attnaudit output (no attnaudit "
                f"{MANIFEST}); choose an empty or new folder, or pass --force to replace the "
                "folder and everything in it")

    @contextlib.contextmanager
    def assembling(self) -> Iterator[Path]:
        """A temporary folder beside the target; moved into place when the block completes,
        deleted (the previous output untouched) when it raises. The location is checked
        again first."""
        self._check_location("output folder")
        parent = self.path.parent
        created = _missing_parents(parent)
        try:
            parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{self.path.name}{_STAGING_PREFIX}",
                                            dir=parent))
        except OSError as exc:
            _remove_empty(created)
            raise OutputFolderError(f"cannot create a folder in {parent}: "
                                    f"{exc.strerror or exc}") from exc
        try:
            yield staging
            self._move_into_place(staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            _remove_empty(created)
            raise

    def _move_into_place(self, staging: Path) -> None:
        """Swap ``staging`` in for the target and delete the previous folder, with Ctrl-C
        and SIGTERM held back until both are done (then raised as usual)."""
        with _signals_deferred():
            old = None
            if self.path.exists():
                old = self.path.parent / f".{self.path.name}.old-{staging.name}"
                self.path.rename(old)
            staging.chmod(0o777 & ~_umask())
            staging.rename(self.path)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM arriving inside the block are acted on after it, by the handlers
    that were in place; outside the main thread (where handlers cannot be set) the block
    simply runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for number in caught[:1]:
        handler = previous[signal.Signals(number)]
        if callable(handler):
            handler(number, None)
        elif handler == signal.SIG_DFL:
            signal.raise_signal(number)


def check_output_file(path: str | Path, what: str) -> None:
    """Refuse, before any work, a file path that cannot be written: empty, a folder, or in
    a folder that is missing or not writable. ``what`` names the file in messages."""
    if str(path).strip() == "":
        raise OutputFolderError(f"cannot write {what}: the path is empty")
    path = Path(os.path.abspath(path))
    if path.is_dir():
        raise OutputFolderError(f"cannot write {what} to {path}: it is a folder")
    if not path.parent.is_dir():
        raise OutputFolderError(f"cannot write {what} to {path}: the folder {path.parent} "
                                "does not exist")
    try:
        Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=path.parent)).rmdir()
    except OSError as exc:
        raise OutputFolderError(f"cannot write {what} to {path}: "
                                f"{exc.strerror or exc}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _missing_parents(folder: Path) -> list[Path]:
    """The folders that ``folder.mkdir(parents=True)`` would create, deepest first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders this run created (deepest first) when they are still empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()
