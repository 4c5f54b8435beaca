# Two entry points for a fresh machine (see README.md):
#   make bench   the main job: small-files benchmark on an embedded MinIO, comparison table
#   make test    type checks and the test suite against real servers started on loopback
# Both create .venv from pinned requirements and build the pinned Go tools into .tools/.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TOOLS  := minio s5cmd fake-gcs-server
REQS   := $(sort $(wildcard requirements/*.txt))

.PHONY: bench test tools env system

$(STAMP): $(REQS) setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(addprefix -r ,$(REQS))
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

env: $(STAMP)

system:
	bash scripts/system-deps.sh

tools: $(STAMP) system
	$(PY) -m pegasus_cloudio.testbed.tools $(TOOLS)

bench: tools
	$(VENV)/bin/pegasus-cloudio bench small-files $(ARGS)

test: tools
	$(PY) -m mypy
	$(PY) -m pytest $(ARGS)
