"""The CLI's fixed cost: what a start imports, and an entry that skips teardown but loses no
output. Speed itself is measured by ``python -m benchmarks --fixed-cost``, never asserted here."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import patience
import pytest


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specbind.cli import main

    out = tmp_path_factory.mktemp("fixed") / "tiny"
    assert main(["synth", str(out), "--layers", "2"]) == 0
    return out


def _modules_after(args: list[str]) -> set[str]:
    code = (
        "import sys, json; from specbind.cli import main; "
        f"rc = main({args!r}); print(json.dumps([rc, sorted(sys.modules)]))"
    )
    proc = patience.run([sys.executable, "-c", code], capture_output=True, text=True, cpu=120)
    assert proc.returncode == 0, proc.stderr
    rc, mods = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rc == 0, proc.stderr
    return set(mods)


def test_bind_without_a_terminal_imports_neither_tqdm_nor_the_generator_stack(ckpt: Path) -> None:
    mods = _modules_after(["bind", str(ckpt), "--json"])
    assert "specbind.runtime.bind.bind" in mods  # it did bind
    for heavy in ("tqdm", "importlib.metadata", "jinja2", "jsonschema", "yaml", "tempfile"):
        assert heavy not in mods, heavy


def test_start_to_first_work_imports_one_models_tables_and_nothing_it_has_not_used(
    tmp_path: Path,
) -> None:
    code = (
        "import sys, json; from specbind.cli import main; "
        f"rc = main(['bind', {str(tmp_path / 'missing')!r}]); print(json.dumps(sorted(sys.modules)))"
    )
    proc = patience.run([sys.executable, "-c", code], capture_output=True, text=True, cpu=120)
    assert "no such directory" in proc.stderr
    mods = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    from specbind.generated import MODELS

    picked = [n for n, e in MODELS.entries.items() if e.default]
    loaded = {n for n, e in MODELS.entries.items() if f"specbind.generated.{e.module}" in mods}
    assert loaded == set(picked)  # the default model's table, no other model's
    # a thread pool (and logging with it), RE2 for quantized configs' lists, the --out writer
    for unused in ("concurrent.futures", "logging", "re2", "specbind.runtime.bound.stream_out"):
        assert unused not in mods, unused
    # the table names its blocks: no block module is built before a block is used; records
    # (core.record) compile no code, and nothing on the way imports dataclasses instead
    table = MODELS[picked[0]]
    assert {b.module_name for b in table.blocks}.isdisjoint(mods)
    assert "dataclasses" not in mods
    assert "traceback" not in mods and "shutil" not in mods  # an internal error's; argparse's


def test_each_table_names_its_blocks_as_their_modules_do() -> None:
    from specbind.generated import MODELS
    from specbind.generated.engines import ENGINES

    tables = [*MODELS.values(), *(x.table for x in ENGINES.values())]
    for table in tables:
        for b in table.blocks:
            assert b.name == b.module.BLOCK, (table.name, b.module_name)
            assert callable(b.binder)


def test_bind_with_progress_asked_for_still_draws_the_bar(ckpt: Path) -> None:
    proc = patience.run(
        [sys.executable, "-m", "specbind", "bind", str(ckpt), "--progress"],
        capture_output=True, text=True, cpu=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "bind: 100%" in proc.stderr


def test_console_entry_flushes_a_large_output_before_skipping_teardown() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered stdout
    proc = patience.run(
        [sys.executable, "-m", "specbind", "plan", "--json"],
        capture_output=True, text=True, cpu=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout) > 65536  # more than a pipe buffer: a lost flush would cut it
    assert json.loads(proc.stdout)["blocks"]


def test_console_entry_exits_with_mains_status_on_a_refusal(tmp_path: Path) -> None:
    proc = patience.run(
        [sys.executable, "-m", "specbind", "bind", str(tmp_path / "missing")],
        capture_output=True, text=True, cpu=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("no such directory")


def test_main_returns_instead_of_exiting_the_callers_interpreter(tmp_path: Path) -> None:
    from specbind.cli import main

    assert main(["bind", str(tmp_path / "missing")]) == 2  # still here: no os._exit in main
