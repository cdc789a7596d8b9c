"""A trusted load tried first in a process of its own, under a PEP 578 audit hook and a time
limit: defence in depth behind the rebuilding unpickler.

The child (``spawn.probe``) imports what the load needs (the modules trust covers, torch's lazily
imported parts through a load of a tiny checkpoint), then installs an audit hook that cannot be
removed and loads the file inside ``audited()``. Any event by which code could run or reach
outside (``exec``, ``compile`` of made-up text, an import, a process, a socket, a file opened
for writing, ctypes) raises inside the load, which stops there; the child reports the event and
the class being rebuilt, and the parent raises a named error (exit 10): nothing has been
written. A child that does not answer within the limit is killed (exit 3), and one whose parent
dies dies with it. What the hook cannot see: code that raises no audit event (pure Python
arithmetic, attribute stores on objects in memory); the rebuilding unpickler is what keeps such
code from being called at all.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ptconvert.errors import UnsafeInputError

# Events that abort a load: running code, processes, the network, native code, the filesystem
# changed. Matched exactly or as a prefix before a dot ("socket" covers socket.connect).
ABORT_EVENTS = frozenset(
    {
        "exec",
        "compile",
        "import",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.link",
        "os.symlink",
        "os.truncate",
        "os.putenv",
        "os.unsetenv",
        "subprocess.Popen",
        "pty.spawn",
        "socket",
        "ctypes",
        "shutil",
        "webbrowser.open",
        "urllib.Request",
        "http.client.connect",
        "ftplib.connect",
        "smtplib.connect",
        "imaplib.open",
        "poplib.connect",
        "telnetlib.Telnet.open",
        "marshal.loads",
        "pickle.find_class",
        "code.__new__",
        "function.__new__",
        "cpython.run_command",
        "cpython.run_file",
        "cpython.run_module",
        "sys.settrace",
        "sys.setprofile",
        "builtins.input",
        "_posixsubprocess.fork_exec",
    }
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Aborted(BaseException):
    """Raised by the audit hook inside the load."""


@contextmanager
def audited() -> Iterator[None]:
    """The audit hook armed for what runs inside (installed once: it cannot be removed); an
    event it stopped is raised on leaving as the named error (exit 10), even if the code that
    got ``Aborted`` caught it."""
    from ptconvert.pickles.rebuild import Rebuilding

    if not _Rebuilding:
        _Rebuilding.append(Rebuilding)
        sys.addaudithook(_hook)
    _ARMED[0] = True
    try:
        yield
    except Aborted:
        pass
    finally:
        _ARMED[0] = False
    if _SEEN:
        event, where = _SEEN[0]
        during = f" while rebuilding {where}" if where else ""
        raise UnsafeInputError(
            f"refused at load: the trusted load raised the audit event {event!r}{during}, so "
            "it was stopped; nothing was written",
            hint="the file tries to run code or reach outside the process: do not load it",
        )


_ARMED = [False]
_SEEN: list[tuple[str, str | None]] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _ARMED[0]:
        return
    if event == "open":  # (path, mode, flags): reading is what a load does
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else 0
        writes = isinstance(mode, str) and any(c in mode for c in "wax+")
        if not writes and not (isinstance(flags, int) and flags & _WRITE_FLAGS):
            return
    elif event == "compile" and _module_source(args):
        return  # torch's legacy loader parses a class's own source file (inspect: ast.parse)
    elif event not in ABORT_EVENTS and event.split(".")[0] not in ABORT_EVENTS:
        return
    # stays armed: code that caught this is stopped again at its next event
    _SEEN.append((event, _Rebuilding[0].current if _Rebuilding else None))
    raise Aborted(event)


def _module_source(args: tuple[Any, ...]) -> bool:
    """A parse of a class's source file by ``inspect.findsource`` (``ast.parse``: no code is
    made), not a compile of text a pickle or a class made up."""
    import inspect

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is inspect.findsource.__code__:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


_Rebuilding: list[Any] = []  # the class whose code may run now (set before the hook is armed)
