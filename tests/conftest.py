"""pytest configuration: Hypothesis profiles (``HYPOTHESIS_PROFILE=ci`` is the default), the
CuPy stand-in fixture shared by the device-path tests, and in the summary the reader fuzzers'
example count (``fuzz_tally``) and where the vLLM proofs' results came from (``vllm_proofs``:
the cache, or a run with its wall and CPU seconds).

Every property follows the loaded profile: none pins ``max_examples``; one that needs more (or
fewer) examples than the rest asks for a multiple of the profile's (``budget.examples``). The
profile is loaded here, before any test module is imported, so those multiples see it."""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import fuzz_tally
import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parent.parent

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def fake_cupy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import fake_cupy

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    cp = fake_cupy.install(str(tmp_path))
    import specbind.generated.kernels as k

    k.module.cache_clear()
    yield cp
    sys.modules.pop("cupy", None)
    k.module.cache_clear()


@pytest.fixture(scope="module")
def generated_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The specs and what they generate, rendered once per module (a test module that breaks
    specs asks for ``root``, its own copy)."""
    from specbind.generator.render import generate

    base = tmp_path_factory.mktemp("generated_once")
    shutil.copytree(REPO / "specs", base / "specs")
    generate(base, base / "generated")
    return base


@pytest.fixture
def root(generated_once: Path, tmp_path: Path) -> Path:
    """A private copy of the specs and their generated/, for a test to break."""
    shutil.copytree(generated_once, tmp_path, dirs_exist_ok=True)
    return tmp_path


def _cpu_seconds() -> float:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``SPECBIND_CPU_REPORT=FILE``, each test's CPU seconds (user + sys, its children
    included) are appended to FILE as ``nodeid<TAB>seconds``: where the suite's CPU goes."""
    out = os.environ.get("SPECBIND_CPU_REPORT")
    t0 = _cpu_seconds() if out else 0.0
    yield
    if out:
        with open(out, "a") as f:
            f.write(f"{item.nodeid}\t{_cpu_seconds() - t0:.3f}\n")


_fuzzed: Counter[str] = Counter()  # reader -> examples run this session (all workers)
_vllm_proofs: dict[str, None] = {}  # the vLLM proofs' report lines, in order, once each


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[Any]:
    outcome: Any = yield
    if call.when == "call":  # the tally travels on the report: xdist carries it to the controller
        for reader, n in fuzz_tally.take().items():
            outcome.get_result().user_properties.append((fuzz_tally.PROPERTY, (reader, n)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == fuzz_tally.PROPERTY:
            reader, n = cast("tuple[str, int]", value)
            _fuzzed[reader] += n
        elif key == "vllm_proofs":
            _vllm_proofs[str(value)] = None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _fuzzed and not hasattr(terminalreporter.config, "workerinput"):
        each = ", ".join(f"{r} {n:,}" for r, n in sorted(_fuzzed.items()))
        total = sum(_fuzzed.values())
        terminalreporter.write_line(f"reader fuzzing: {total:,} generated examples ({each})")
    if not hasattr(terminalreporter.config, "workerinput"):
        for line in _vllm_proofs:
            terminalreporter.write_line(line)
