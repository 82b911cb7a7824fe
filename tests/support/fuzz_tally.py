"""How many generated examples the reader fuzzers run: planned at decoration, counted as run.

Each reader fuzzer takes its ``max_examples`` from ``planned(reader, times)`` (``times`` the
profile's count, as ``budget.examples``), which also records the plan, and calls
``tally(reader)`` once per example it runs. ``tests/conftest.py`` moves each test's tally onto
its report (``user_properties``, which pytest-xdist carries back from the workers) and prints
the session's total per reader in the pytest summary.
Trap: the tally counts every call of the test body, so it includes the few explicit
``@example`` regressions and any shrinking replays; the generated share is within a few of it.
"""

from __future__ import annotations

from collections import Counter

from budget import examples

PROPERTY = "reader fuzz examples"  # the user_properties key a report carries its tally under
PLANNED: dict[str, float] = {}  # reader -> multiples of the profile's max_examples
_run: Counter[str] = Counter()


def planned(reader: str, times: float) -> int:
    """``examples(times)``, recorded as ``reader``'s share of the plan."""
    PLANNED[reader] = PLANNED.get(reader, 0) + times
    return examples(times)


def tally(reader: str) -> None:
    _run[reader] += 1


def take() -> dict[str, int]:
    """The examples run since the last call, by reader (and the tally restarts)."""
    out = dict(_run)
    _run.clear()
    return out
