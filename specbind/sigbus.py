"""SIGBUS from a checkpoint file that shrank under its map: one line naming the file, and exit.

A read of a memory map past its file's end raises SIGBUS; by default the process dies (exit
135) with no word. ``SafetensorsFile.check_size`` refuses a file that has shrunk before each
tensor is taken, but a file truncated between that check and the copy still faults. Inside
``refuse_sigbus(status)`` (the CLI wraps every command in it) such a fault prints
``specbind: error: FILE: is N B now, M B when opened (...): the file was truncated or rewritten
while it was read; ...`` on stderr in one write and ends the process with ``status`` (a
refusal: 1).

Invariants:
- only a fault at an address inside an open checkpoint file's map (``safetensors_file.mapped_at``)
  is ours: any other SIGBUS (another library's map, a hardware error) gets the handler that was
  there before (the default: the process dies as it would have) by re-raising it;
- the process ends with ``os._exit``: no ``finally`` runs, so an ``--out`` temp file is left
  behind, which the next write to that path removes (``runtime.io.atomic``); the previous
  output is never touched (the rename never happened);
- the handler is installed only in the main thread and restored on leaving.
Why by hand, through ``ctypes``: Python's ``signal.signal`` runs a Python handler only once the
faulting C code returns, which it never does (it faults again: a hang), and ``faulthandler``
prints a traceback and dies by the signal; a ``sigaction`` handler with ``SA_SIGINFO`` runs at
the fault and receives its address. The handler is a ``ctypes`` callback: it takes the GIL (the
faulting thread holds it, or waits for it), writes one line and calls ``_exit``.
Trap: the ``struct sigaction`` layout below is glibc's on Linux (x86-64 and AArch64 alike);
elsewhere (macOS, Windows, musl untested) nothing is installed and a fault kills the process as
before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

SA_SIGINFO = 4
SI_ADDR_OFFSET = 16  # siginfo_t: si_signo, si_errno, si_code, padding; then si_addr (64-bit)


class _Sigaction(ctypes.Structure):
    _fields_ = (
        ("sa_sigaction", ctypes.c_void_p),
        ("sa_mask", ctypes.c_ulong * (128 // ctypes.sizeof(ctypes.c_ulong))),
        ("sa_flags", ctypes.c_int),
        ("sa_restorer", ctypes.c_void_p),
    )


_HANDLER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_state: dict[str, Any] = {}  # status, the previous action, the callback (kept alive)


def _libc() -> Any:
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sigaction.argtypes = (
            ctypes.c_int, ctypes.POINTER(_Sigaction), ctypes.POINTER(_Sigaction),
        )  # fmt: skip
        return libc
    except (OSError, AttributeError):
        return None


def _message(address: int) -> str | None:
    """The line for a fault at ``address``, or None when no open checkpoint map holds it."""
    from specbind.runtime.io.safetensors_file import mapped_at, shrunk_message

    found = mapped_at(address)
    if found is None:
        return None
    f, offset = found
    now = f.shrunk()
    if now is None:  # mapped past its end some other way: say what is known
        return (
            f"{f.where}: a read at byte {offset} failed (SIGBUS): the file changed while it "
            "was read; bind it again once nothing writes it"
        )
    return shrunk_message(f.where, now, f.size, f"byte {offset}")


def _on_sigbus(signum: int, info: int | None, context: int | None) -> None:
    try:
        address = ctypes.c_void_p.from_address(info + SI_ADDR_OFFSET).value if info else None
        line = _message(address) if address else None
    except BaseException:  # never return into the fault with nothing changed: a hang
        line = None
    if line is None:  # not a checkpoint map: the handler there before decides, as it would
        libc = _libc()
        if libc is not None and "previous" in _state:
            libc.sigaction(signal.SIGBUS, ctypes.byref(_state["previous"]), None)
        else:
            signal.signal(signal.SIGBUS, signal.SIG_DFL)
        return  # the faulting access runs again and gets that handler
    os.write(2, f"specbind: error: {line}\n".encode("utf-8", "backslashreplace"))
    os._exit(_state["status"])


@contextlib.contextmanager
def refuse_sigbus(status: int) -> Iterator[None]:
    """Within it, a SIGBUS from a checkpoint map is one line naming the file and exit
    ``status``; nothing is installed off the main thread or off Linux with glibc."""
    libc = _libc()
    if libc is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    callback = _HANDLER_TYPE(_on_sigbus)
    action = _Sigaction()
    action.sa_sigaction = ctypes.cast(callback, ctypes.c_void_p).value
    action.sa_flags = SA_SIGINFO
    previous = _Sigaction()
    if libc.sigaction(signal.SIGBUS, ctypes.byref(action), ctypes.byref(previous)) != 0:
        yield  # refused by the C library: the default stays
        return
    saved = dict(_state)
    _state.update(status=status, previous=previous, callback=callback)
    try:
        yield
    finally:
        libc.sigaction(signal.SIGBUS, ctypes.byref(previous), None)
        _state.clear()
        _state.update(saved)
