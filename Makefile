# Two commands on a fresh machine with python3 and pip:
#   make repro   set up .venv, run the DVC pipeline, print the report
#   make test    set up .venv with test dependencies and the optional extras, run pytest
#   make lint    ruff (the rules in pyproject.toml) over recallk, stages, tests and bench
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Stage commands in dvc.yaml call `python`; make it the venv's.
export PATH := $(CURDIR)/$(BIN):$(PATH)
PIP_INSTALL := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: repro test lint check-repro venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(PIP_INSTALL) -e .
	touch $@

# Tests cover the optional extras too, so they install them (torch 2.14.1 + torchvision: ~75 s, 5.6 GB).
$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP_INSTALL) -e '.[test,torch,faiss,hnswlib,timm,open-clip,hf,ray,peers,ranx,dvclive,lightning,hf-trainer]'
	touch $@

$(VENV)/.installed-lint: $(VENV)/.installed
	$(PIP_INSTALL) -e '.[lint]'
	touch $@

venv: $(VENV)/.installed

# The report block is printed once, by --show, whether score ran now or was up to date.
repro: $(VENV)/.installed
	RECALLK_NO_REPORT=1 $(BIN)/dvc repro --quiet
	@$(BIN)/python -m stages.score --show

# One pytest worker per core (pytest-xdist); tests that share a Ray cluster stay on one worker (loadgroup).
# Every extra is installed, so none of their tests may skip (RECALLK_REQUIRE_EXTRAS: a missing one fails).
# Without the extras, `pytest -m "not pipeline and not ray"` runs the core tests and skips the extras' ones.
test: $(VENV)/.installed-test
	RECALLK_REQUIRE_EXTRAS=1 $(BIN)/python -m pytest -n auto --dist loadgroup --durations=25

lint: $(VENV)/.installed-lint
	$(BIN)/ruff check recallk stages tests bench

# CI reproducibility check: recompute every stage (--force: the committed metrics file would
# otherwise let DVC skip score), then the lock file and metrics must be byte-identical; the index stage's
# timings (metrics/index_speed.*, not DVC outs: docs/index.md#outputs) are measurements, left out.
check-repro: $(VENV)/.installed
	$(BIN)/dvc repro --force
	git diff --exit-code dvc.lock metrics/ ':(exclude)metrics/index_speed.json' ':(exclude)metrics/index_speed.csv'

clean:
	rm -rf $(VENV)
