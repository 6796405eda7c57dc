"""Atomic files and folders: the one home of the package's temporary-then-rename writes.

    with atomic.writing("OUT/predictions.tsv") as f:   # the old file, or the whole new one; never half of one
        f.write(...)
    atomic.write_json("exit_policy.json", record)
    with atomic.staging_folder("OUT/onnx") as tmp:     # build in tmp; then swapped in, then the old deleted
        build(tmp)

Temporaries sit beside their destination as ``.NAME.tmp-PID-XXXX`` and a replaced folder, while it still
exists, as ``.NAME.old-PID-XXXX``: the process id says whose they are. A run killed at any instant (SIGKILL
included) leaves at most such entries, and the next write to the same folder removes those whose process is
gone (:func:`clean_stale`), first putting back an ``.old`` folder whose destination is missing. A live run's
temporaries are never touched.

A folder is replaced by exchanging the two names in one ``renameat2(RENAME_EXCHANGE)`` call where Linux offers
it, else by two renames with the old folder kept beside the destination (outside the temporary folder) until
the new one is in place, and put back on any error: at every instant the destination or its ``.old`` copy holds
a whole folder. Standard library only (no torch, no fairseq).
"""
import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import re
import secrets
import shutil
import time
from typing import Callable, Iterator, List, Optional

RUN_START = time.time()  # entries without a process id count as stale only when they are older than this run
_NAMED = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-[A-Za-z0-9_]+(\.[A-Za-z0-9]+)?$")
# what mkdtemp(prefix=".export.tmp-") wrote before temporaries carried their process id
_LEGACY = re.compile(r"^\.(?P<name>.+)\.tmp-[A-Za-z0-9_]{8}$")
# the earlier writers' FILE.tmpPID (acl-predict's --output still names its temporary so)
_PLAIN = re.compile(r"^(?P<name>.+)\.tmp(?P<pid>\d+)$")
_RENAME_EXCHANGE = 2


def _step(name: str) -> None:
    """Called between every two steps of a replace: a test raises here to stand for a signal at that instant."""


def _token() -> str:
    return secrets.token_hex(4)


def temp_path(path: str, kind: str = "tmp", suffix: str = "") -> str:
    """A fresh sibling of ``path`` named for this process: ``.NAME.tmp-PID-XXXX`` (or ``.old-``), then
    ``suffix`` (for a writer that picks its format by the extension)."""
    head, base = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{base}.{kind}-{os.getpid()}-{_token()}{suffix}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def clean_stale(folder: str, name: Optional[str] = None) -> List[str]:
    """Remove the temporaries in ``folder`` (of ``name`` only, when given) left by runs that are gone: their
    process has ended, or (names without a process id) they predate this run. An ``.old`` folder whose
    destination is missing is put back instead (a replace killed between its two renames). Returns what was
    removed or restored."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    done = []
    for entry in entries:
        # the older spellings carry no marks of ours: only for the named destination
        match = _NAMED.match(entry) or (_PLAIN.match(entry) if name is not None else None)
        path = os.path.join(folder, entry)
        if match:
            if name is not None and match["name"] != name or _alive(int(match["pid"])):
                continue
            dest = os.path.join(folder, match["name"])
            if match.groupdict().get("kind") == "old" and not os.path.lexists(dest):
                os.rename(path, dest)
            else:
                _remove(path)
            done.append(path)
            continue
        legacy = _LEGACY.match(entry)
        if legacy and legacy["name"] == name:
            with contextlib.suppress(OSError):
                if os.lstat(path).st_mtime < RUN_START:
                    _remove(path)
                    done.append(path)
    return done


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Pending:
    """A file being written: a temporary beside ``path``, opened (``file``); :meth:`commit` renames it over
    ``path`` (after fsync), :meth:`discard` removes it. For a writer that streams over a whole run (acl-predict's
    ``--output``); :func:`writing` is the same for a block. An existing ``path`` is a FileExistsError unless
    ``force``."""

    def __init__(self, path: str, mode: str = "w", encoding: Optional[str] = "utf-8", force: bool = True,
                 tmp: Optional[str] = None):
        self.path = os.path.abspath(path)
        if not force and os.path.lexists(self.path):
            raise FileExistsError(errno.EEXIST, "exists; pass --force to replace it", self.path)
        clean_stale(os.path.dirname(self.path), os.path.basename(self.path))
        self.tmp = tmp or temp_path(self.path)
        self.file = open(self.tmp, mode, **({} if "b" in mode else {"encoding": encoding}))

    def commit(self) -> None:
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            _step("written")
            os.replace(self.tmp, self.path)
            _fsync_dir(os.path.dirname(self.path))
        finally:
            self.discard()

    def discard(self) -> None:
        self.file.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)


@contextlib.contextmanager
def writing(path: str, mode: str = "w", encoding: Optional[str] = "utf-8", force: bool = True) -> Iterator:
    """A file object on a temporary beside ``path``, renamed over ``path`` when the block ends without an error
    (after fsync), removed otherwise: readers see the old file or the whole new one (:class:`Pending`)."""
    pending = Pending(path, mode, encoding, force)
    try:
        yield pending.file
        pending.commit()
    finally:
        pending.discard()


def write_through(path: str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` for a writer that wants a path (a CSV writer, matplotlib's ``savefig``), then ``tmp``
    renamed over ``path``; ``tmp`` keeps ``path``'s extension."""
    path = os.path.abspath(path)
    clean_stale(os.path.dirname(path), os.path.basename(path))
    tmp = temp_path(path, suffix=os.path.splitext(path)[1])
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        _step("written")
        os.replace(tmp, path)
        _fsync_dir(os.path.dirname(path))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def probe_writable(path: str) -> None:
    """Create and remove a temporary beside ``path`` (named as every temporary here, so a run killed in between
    leaves one the next run removes): the OSError of a folder this process cannot create a file in. Permission
    bits say nothing for root, nor for a read-only or immutable mount, so a command asks before its work."""
    probe = temp_path(path, suffix=".probe")
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    os.remove(probe)


def probe_folder(folder: str) -> None:
    """The OSError of a ``folder`` this process could not create, or create files in, without creating anything:
    the nearest folder of the path that exists is tried with :func:`probe_writable`."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise NotADirectoryError(errno.ENOTDIR, "a file is in the way", existing)
    probe_writable(os.path.join(existing, ".probe"))


def write_text(path: str, text: str, force: bool = True) -> None:
    with writing(path, force=force) as f:
        f.write(text)


def write_bytes(path: str, data: bytes, force: bool = True) -> None:
    with writing(path, "wb", force=force) as f:
        f.write(data)


def write_json(path: str, obj, indent: int = 1, force: bool = True) -> None:
    with writing(path, force=force) as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")


def _libc_exchange() -> Optional[Callable[[str, str], None]]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return None
    at_fdcwd = -100

    def exchange(a: str, b: str) -> None:
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), a, None, b)

    return exchange


_exchange = _libc_exchange()


def replace_folder(src: str, dest: str) -> None:
    """Put the folder ``src`` at ``dest`` (a sibling path on the same file system), then delete what ``dest``
    held: swap, then delete. Interrupted at any instant (an exception or a signal between two steps), ``dest`` or
    its ``.old`` copy beside it holds a whole folder, and an error puts the old one back."""
    if not os.path.lexists(dest):
        _step("place")
        os.rename(src, dest)
        return
    if _exchange is not None:
        try:
            _step("exchange")
            _exchange(src, dest)  # one system call: dest is the old folder, then the new one
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
        else:
            _step("exchanged")
            _remove(src)  # now the old folder
            return
    old = temp_path(dest, "old")
    _step("keep-old")
    os.rename(dest, old)
    try:
        _step("place")
        os.rename(src, dest)
    except BaseException:
        if not os.path.lexists(dest):
            os.rename(old, dest)
        raise
    _step("placed")
    _remove(old)


@contextlib.contextmanager
def staging_folder(dest: str, force: bool = True) -> Iterator[str]:
    """A fresh temporary folder beside ``dest``; when the block ends without an error it replaces ``dest``
    (:func:`replace_folder`), otherwise it is removed and ``dest`` is left as it was. Stale temporaries of
    ``dest`` from killed runs are removed first."""
    dest = os.path.abspath(dest)
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    clean_stale(parent, os.path.basename(dest))
    tmp = temp_path(dest)
    os.mkdir(tmp)
    try:
        yield tmp
        if not force and os.path.lexists(dest):
            raise FileExistsError(errno.EEXIST, "exists; pass --force to replace it", dest)
        replace_folder(tmp, dest)
    finally:
        if os.path.lexists(tmp):
            _remove(tmp)
