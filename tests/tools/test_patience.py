"""The tests' bound on their child processes (tests/support/patience.py) stops loops and hangs,
and never a run that is only slow: it counts CPU time, not wall time."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import patience
import pytest

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


def test_a_child_that_takes_longer_than_its_bound_in_wall_time_but_not_in_cpu_is_not_stopped() -> (
    None
):
    """A child that works 10 % of the time, as on a machine at load 10 on one core: 2.5 s of
    wall time against a bound of 1.5 s (a wall deadline of 1.5 s would kill it), ~0.3 s of CPU."""
    code = (
        "import time\n"
        "end = time.monotonic() + 2.5\n"
        "while time.monotonic() < end:\n"
        "    t = time.monotonic() + 0.01\n"
        "    while time.monotonic() < t: pass\n"
        "    time.sleep(0.09)\n"
        "print('done')\n"
    )
    t0 = time.monotonic()
    proc = patience.run([PY, "-c", code], cpu=1.5, stall=1.5, capture_output=True, text=True)
    assert time.monotonic() - t0 > 1.5
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr


def test_a_loop_in_a_grandchild_is_stopped_at_the_cpu_bound_and_the_whole_tree_killed(
    tmp_path: Path,
) -> None:
    pid = tmp_path / "pid"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        f"open({str(pid)!r}, 'w').write(str(p.pid))\n"
        "print('looping', file=sys.stderr, flush=True)\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(patience.Stopped) as e:
        patience.run([PY, "-c", code], cpu=1, capture_output=True, text=True)
    msg = str(e.value)
    assert "over its bound of 1 s (a loop?): killed" in msg and "looping" in msg, msg
    assert patience.killed(int(pid.read_text()))


def test_killed_tells_a_live_process_from_a_sigkilled_one_without_waiting() -> None:
    child = subprocess.Popen([PY, "-c", "import time; time.sleep(600)"])
    try:
        assert not patience.killed(child.pid)
        child.kill()
        assert patience.killed(child.pid)  # at once: pending, a zombie, or gone
    finally:
        child.kill()
        child.wait()
    assert patience.killed(child.pid)


def test_a_child_that_hangs_is_stopped_once_it_used_no_cpu_for_the_stall_window() -> None:
    code = "import sys, time; print('waiting', file=sys.stderr, flush=True); time.sleep(600)"
    t0 = time.monotonic()
    with pytest.raises(patience.Stopped) as e:
        patience.run([PY, "-c", code], cpu=600, stall=2, capture_output=True, text=True)
    assert time.monotonic() - t0 < 300  # stopped by the stall window, not by the CPU bound
    assert "used no CPU for" in str(e.value) and "(a hang?)" in str(e.value)
    assert "waiting" in str(e.value)


def test_wait_kills_every_run_when_one_hangs_and_returns_each_ones_output_otherwise() -> None:
    quick = [subprocess.Popen([PY, "-c", f"print({i})"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]  # fmt: skip
    assert patience.wait(*quick, cpu=60) == [(0, "0\n", ""), (0, "1\n", "")]
    runs = [
        subprocess.Popen([PY, "-c", c], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c in ("import time; time.sleep(600)", "print('ok')")
    ]
    with pytest.raises(patience.Stopped, match="used no CPU"):
        patience.wait(*runs, cpu=600, stall=2)
    assert all(p.poll() is not None for p in runs)


def test_run_takes_subprocess_runs_arguments_and_refuses_a_wall_timeout() -> None:
    proc = patience.run([PY, "-c", "import sys; print(sys.stdin.read().upper())"],
                        input="abc", capture_output=True, text=True, cpu=60)  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, "ABC\n")
    with pytest.raises(subprocess.CalledProcessError):
        patience.run([PY, "-c", "raise SystemExit(3)"], cpu=60, check=True)
    with pytest.raises(TypeError, match="not wall time"):
        patience.run([PY, "-c", ""], cpu=60, timeout=5)


def test_no_test_bounds_a_child_by_the_wall_clock() -> None:
    """No call in tests/ passes ``timeout=`` (subprocess.run, communicate, wait): a child is
    bounded by ``patience`` (CPU and stalls), or, for the vLLM workers, by their progress
    lines. Only patience's own poll and the check above that it refuses one are left."""
    allowed = {("tests/support/patience.py", "proc.communicate"),
               ("tests/tools/test_patience.py", "patience.run")}  # fmt: skip
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if not isinstance(node, ast.Call) or all(k.arg != "timeout" for k in node.keywords):
                continue
            if (rel, ast.unparse(node.func)) not in allowed:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}(timeout=...)")
    assert not found, "\n".join(found)
