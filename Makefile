# Two entry points for a fresh machine (see README.md):
#   make bench   the main job: small-files benchmark on an embedded MinIO, comparison table
#   make test    type checks and the test suite against real servers started on loopback
# Both create .venv from pinned requirements and build the pinned Go tools into .tools/.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: bench test tools env

$(STAMP): requirements/dev.txt setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements/dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

env: $(STAMP)

tools: $(STAMP)
	$(PY) -m pegasus_cloudio.testbed.tools minio s5cmd

bench: tools
	$(VENV)/bin/pegasus-cloudio bench small-files $(ARGS)

test: tools
	$(PY) -m mypy
	$(PY) -m pytest $(ARGS)
