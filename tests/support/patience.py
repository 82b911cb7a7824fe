"""The tests' child processes bounded by the work they do, never by the clock.

A loaded machine gives a slow run, not an error: at load 12 to 19 on 2 cores a healthy run
takes ten times its wall time and the same CPU time, so a wall-clock deadline fails it while
a CPU bound does not. A child (with every process under it) is stopped only when
- it has used more than ``cpu`` seconds of CPU time: a loop that never ends; or
- it has used no CPU at all for ``stall`` seconds of wall time: a hang (a deadlock, a wait on
  what never comes). A starved process still gets CPU ticks every few seconds, whatever the
  load; a blocked one gets none.
Either way the whole tree is killed and one ``Stopped`` (an ``AssertionError``) names the
command, why, and the tail of what it printed.

``run`` takes ``subprocess.run``'s arguments (``cpu=`` and ``stall=`` in place of
``timeout=``); ``wait`` waits for started ``Popen`` objects together (torchrun's nodes);
``Watch(procs, cpu=, stall=).check(what)`` is one look, for a test that polls for something else
meanwhile (a file a child writes).
Traps: the CPU time of a tree is read from /proc (Linux: each live process's utime + stime, and
cutime + cstime for its children already reaped), every ``POLL`` seconds; where /proc is absent
(macOS) the tree cannot be measured, and a wall bound of ``NO_PROC_WALL`` x ``cpu`` stands in.
A process that leaves the tree (a daemon re-parented to init) is no longer counted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

POLL = 1.0  # seconds between two reads of the tree's CPU time
STALL = 300.0  # default: seconds without one CPU tick before a child is called hung
NO_PROC_WALL = 10  # without /proc: the wall bound, as a multiple of the CPU bound
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


class Stopped(AssertionError):
    """A child killed for looping (over its CPU bound) or hanging (no CPU for ``stall`` s)."""


def _stat(pid: int) -> list[str] | None:
    """The fields after the command name in /proc/PID/stat (field 3, the state, first)."""
    try:
        return (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    tasks = _PROC / str(pid) / "task"
    try:
        for task in tasks.iterdir():
            with contextlib.suppress(OSError):
                kids += [int(k) for k in (task / "children").read_text().split()]
        return kids
    except OSError:
        return kids


def tree(pid: int) -> list[int]:
    """``pid`` and every live process under it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """CPU seconds used by the processes under ``pids`` (their reaped children included); None
    where /proc cannot say (not Linux)."""
    if not (_PROC / "self" / "stat").exists():
        return None
    ticks = 0
    for root in pids:
        for p in tree(root):
            fields = _stat(p)
            if fields is not None and len(fields) > 14:
                ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / _TICK


def killed(pid: int) -> bool:
    """Whether process ``pid`` is gone, a zombie, or has a SIGKILL pending (it ends the next
    time it runs, which on a loaded machine is not at once): a check with no wait in it."""
    try:
        status = (_PROC / str(pid) / "status").read_text()
    except OSError:
        return True
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("State", "").strip()[:1] in ("Z", "X"):
        return True
    bit = 1 << (signal.SIGKILL - 1)
    return any(int(fields.get(k, "0").strip() or "0", 16) & bit for k in ("SigPnd", "ShdPnd"))


def _kill(procs: Sequence[subprocess.Popen[Any]]) -> str:
    """SIGKILL every process of the trees, leaves first; reap them; the tail of what each
    printed (communicate() keeps what it read before)."""
    killed = []
    for proc in procs:
        for p in reversed(tree(proc.pid)):
            fields = _stat(p)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
                if fields is not None:
                    killed.append((p, fields[19]))  # field 22, its start time: one process
    # SIGKILL acts when the process next runs (on a loaded machine, not at once), and cannot
    # be caught: wait, unbounded, until each is dead (a zombie, reaped, or its pid reused).
    while killed:
        time.sleep(0.01)
        killed = [
            (p, start)
            for p, start in killed
            if (f := _stat(p)) is not None and f[19] == start and f[0] not in "ZX"
        ]
    tails = []
    for proc in procs:
        with contextlib.suppress(Exception):
            out, err = proc.communicate()
            tails.append(_tail(err) or _tail(out))
    return "\n".join(t for t in tails if t)


class Watch:
    """The CPU that ``procs`` have used together (each one's last reading kept once it ends),
    and when it last moved."""

    def __init__(
        self, procs: Sequence[subprocess.Popen[Any]], cpu: float, stall: float = STALL
    ) -> None:
        self.procs, self.cpu, self.stall = procs, cpu, stall
        self.seen: dict[int, float] = {}
        self.total: float | None = None
        self.started = self.moved = time.monotonic()

    def why_stop(self) -> str | None:
        """One look: why to stop the children now, or None."""
        now = time.monotonic()
        for proc in self.procs:
            if proc.poll() is None:
                used = cpu_seconds([proc.pid])
                if used is None:
                    if now - self.started > NO_PROC_WALL * self.cpu:
                        return f"ran {now - self.started:.0f} s of wall time (no /proc to read its CPU)"
                    return None
                self.seen[proc.pid] = max(used, self.seen.get(proc.pid, 0.0))
        total = sum(self.seen.values())
        if total > self.cpu:
            return f"used {total:.0f} s of CPU, over its bound of {self.cpu:g} s (a loop?)"
        if total != self.total:
            self.total, self.moved = total, now
        elif now - self.moved > self.stall:
            return f"used no CPU for {now - self.moved:.0f} s (a hang?)"
        return None

    def check(self, what: str) -> None:
        """One look; where the children are to stop, kill their trees and raise ``Stopped``
        naming ``what``, why, and the tail of what they printed."""
        why = self.why_stop()
        if why is not None:
            raise Stopped(f"{what} {why}: killed\n{_kill(self.procs)}")


def _tail(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").splitlines()[-20:])


def _finish(
    procs: Sequence[subprocess.Popen[Any]],
    inputs: Sequence[Any],
    what: str,
    cpu: float,
    stall: float,
) -> list[tuple[Any, Any]]:
    """Each of ``procs``' (stdout, stderr), its input written and its pipes drained in turn;
    the watch looks between two reads."""
    watch, out = Watch(procs, cpu, stall), []
    for proc, pending in zip(procs, inputs, strict=True):
        while True:
            try:
                out.append(proc.communicate(pending, timeout=POLL))
                break
            except subprocess.TimeoutExpired:
                pending = None  # communicate() keeps the input it began to write
                watch.check(what)
    return out


def run(
    args: Sequence[str],
    *,
    cpu: float,
    stall: float = STALL,
    input: str | bytes | None = None,
    capture_output: bool = False,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(args, ...)`` stopped only by ``cpu`` seconds of CPU or ``stall``
    seconds without any (see the module's docstring)."""
    if "timeout" in kwargs:
        raise TypeError("patience.run bounds CPU (cpu=, stall=), not wall time (timeout=)")
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with subprocess.Popen(args, **kwargs) as proc:
        ((out, err),) = _finish([proc], [input], str(list(args)), cpu, stall)
    done = subprocess.CompletedProcess(args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def wait(
    *procs: subprocess.Popen[str], cpu: float, stall: float = STALL
) -> list[tuple[int, str, str]]:
    """Every started ``procs``' (rc, stdout, stderr); all are killed (their trees too) and
    ``Stopped`` raised when together they pass ``cpu`` seconds of CPU or use none for
    ``stall`` seconds."""
    what = f"{len(procs)} run(s) of {procs[0].args!r}" if procs else "nothing"
    outs = _finish(procs, [None] * len(procs), what, cpu, stall)
    return [(p.returncode, so, se) for p, (so, se) in zip(procs, outs, strict=True)]
