"""The reader fuzzers' plan: under the ``ci`` profile (what ``make test`` runs) every reader
the issue names is fuzzed, with at least 10,000 generated examples between them. The count a
run really made is printed in the pytest summary (``fuzz_tally``)."""

from __future__ import annotations

import importlib

from fuzz_tally import PLANNED
from hypothesis import settings

FUZZERS = ("test_fuzz_checkpoint", "test_fuzz_config", "test_fuzz_reload")


def test_the_readers_get_at_least_10000_generated_examples_a_ci_run() -> None:
    for name in FUZZERS:  # their decorators record the plan (already done if pytest collected them)
        importlib.import_module(name)
    assert set(PLANNED) == {
        "safetensors header", "index", "config.json", "quant configs", "reload metadata",
    }  # fmt: skip
    per_run = sum(PLANNED.values()) * settings.get_profile("ci").max_examples
    assert per_run >= 10_000, PLANNED
