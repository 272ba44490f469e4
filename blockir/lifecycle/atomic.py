"""Safe writes: a reader sees a directory's old whole or its new whole, never a mixture, and never nothing.

Every artifact directory (a checkpoint, a release, a serving slot) is built complete in a
staging sibling ``.NAME.blockir-new-PID`` and renamed into place; POSIX ``rename`` is atomic
within one file system. Replacing an existing directory renames it aside first
(``.NAME.blockir-old-PID``), renames the new one in, then removes the old one, with SIGINT and
SIGTERM held back for those steps and delivered right after. Only a hard kill (SIGKILL, a power cut) can stop between
them; then the directory is missing and its old whole lies beside it under a name only this
module writes: :func:`recover` (called before every read and every write of an artifact) renames
it back and removes staging folders whose process is gone.

SIGINT and SIGTERM become :class:`Interrupted` (:func:`handle_signals`), so a command stops
between writes with no traceback. ``BLOCKIR_TEST_KILL_AT=K`` (with ``BLOCKIR_TEST_KILL_SIGNAL``:
INT, TERM or KILL) makes the process send itself the signal at its K-th write boundary, so tests
interrupt real processes at every one of them.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path
from typing import Iterator, Mapping

NEW, OLD = ".blockir-new-", ".blockir-old-"
KILL_AT = "BLOCKIR_TEST_KILL_AT"
KILL_SIGNAL = "BLOCKIR_TEST_KILL_SIGNAL"
HELD = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: the command stops where it stands; the exit code is 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` inside; the previous handlers come back afterwards."""
    try:
        previous = {s: signal.signal(s, _raise) for s in HELD}
    except ValueError:  # not the main thread: signals stay with whoever owns them
        yield
        return
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is over, then raise :class:`Interrupted` as they would have.

    Deferred in Python's handlers rather than by a signal mask: in a process with other threads
    (torch's) the kernel may hand a masked signal to one of them, and Python runs its handler anyway.
    """
    pending: list[int] = []
    try:
        previous = {s: signal.signal(s, lambda signum, _frame: pending.append(signum)) for s in HELD}
    except ValueError:  # not the main thread: no handler of ours can run here
        yield
        return
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if pending:
        handler = previous[signal.Signals(pending[0])]
        if callable(handler):
            handler(pending[0], None)
        elif handler == signal.SIG_DFL:
            signal.raise_signal(pending[0])


def boundary() -> None:
    """One write boundary passed; the test hook may stop the process here.

    The hook counts down in the environment it is given, so each test sets its own count.
    """
    left = os.environ.get(KILL_AT)
    if left is None or not left.isdigit() or left == "0":
        return
    os.environ[KILL_AT] = str(int(left) - 1)
    if left == "1":
        name = os.environ.get(KILL_SIGNAL, "TERM")
        os.kill(os.getpid(), getattr(signal, f"SIG{name}", signal.SIGTERM))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_file(path: str | Path, data: bytes) -> None:
    """``path`` holds ``data`` whole, or what it held before: a temporary sibling, fsynced, then renamed."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}{NEW}{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        _write(tmp, data)
        boundary()
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(target.parent)


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _siblings(target: Path, marker: str) -> list[Path]:
    prefix = f".{target.name}{marker}"
    if not target.parent.is_dir():
        return []
    return sorted(p for p in target.parent.iterdir() if p.name.startswith(prefix) and not p.is_symlink() and p.is_dir())


def recover(path: str | Path) -> None:
    """Undo what a hard kill left of a replacement of ``path``: its old whole back, dead staging removed."""
    target = Path(path)
    for aside in _siblings(target, OLD):
        pid = aside.name.rsplit("-", 1)[-1]
        if _alive(pid):
            continue
        if not os.path.lexists(target):
            os.rename(aside, target)
        else:  # the new whole is in place: the old one was on its way out
            shutil.rmtree(aside)
    for staging in _siblings(target, NEW):
        if not _alive(staging.name.rsplit("-", 1)[-1]):
            shutil.rmtree(staging)


def publish(path: str | Path, files: Mapping[str, bytes], read_only: bool = False) -> None:
    """Make ``path`` a directory holding exactly ``files`` (name → bytes), replacing what is there whole.

    The caller has decided that replacing is allowed (:mod:`blockir.lifecycle.destination`).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    staging = target.with_name(f".{target.name}{NEW}{os.getpid()}")
    aside = target.with_name(f".{target.name}{OLD}{os.getpid()}")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        for name, data in files.items():
            _write(staging / name, data)
            if read_only:
                (staging / name).chmod(0o444)
            boundary()
        _fsync_dir(staging)
        with _held():
            boundary()
            replacing = os.path.lexists(target)
            if replacing:
                os.rename(target, aside)
                boundary()
            os.rename(staging, target)
            _fsync_dir(target.parent)
            boundary()
            if replacing:
                shutil.rmtree(aside)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
        if aside.exists() and not os.path.lexists(target):
            os.rename(aside, target)
