# Two entry points for a fresh machine (see README.md):
#   make bench   the main job: small-files benchmark on an embedded MinIO, comparison table;
#                builds only MinIO, s5cmd, Pegasus's Go pegasus-transfer and Azurite (npm), needs no root
#   make test    type checks and the test suite against real servers started on loopback;
#                also installs the system packages the servers need (scripts/system-deps.sh)
#                and builds the HTCondor pools' Debian 13 and testing roots (make pool)
# Both create .venv from pinned requirements and build the pinned Go tools into .tools/; long
# steps print a line every 30 s (scripts/heartbeat.sh).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TOOLS  := minio s5cmd fake-gcs-server pegasus-transfer-go azurite
BENCH_TOOLS := minio s5cmd pegasus-transfer-go azurite
HEARTBEAT := bash scripts/heartbeat.sh
REQS   := $(sort $(wildcard requirements/*.txt))
BENCH_DIST := bench

.PHONY: bench test tools env system pool

$(STAMP): $(REQS) setup.cfg pyproject.toml $(BENCH_DIST)/setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(HEARTBEAT) "pip install -r requirements/*.txt" $(PY) -m pip install --quiet $(addprefix -r ,$(REQS))
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . -e $(BENCH_DIST)
	touch $(STAMP)

env: $(STAMP)

system:
	bash scripts/system-deps.sh

tools: $(STAMP) system
	$(HEARTBEAT) "building $(TOOLS)" $(PY) -m pegasus_cloudio_testbed.tools $(TOOLS)
	$(HEARTBEAT) "installing the pinned Azure CLI (the Azure baseline)" $(PY) -m pegasus_cloudio_testbed.azure_cli

bench: $(STAMP)
	$(HEARTBEAT) "building $(BENCH_TOOLS)" $(PY) -m pegasus_cloudio_testbed.tools $(BENCH_TOOLS)
	$(VENV)/bin/pegasus-cloudio bench small-files $(ARGS)

# The Debian roots the real HTCondor pools of the tests run in (root; cached per machine
# under /var/cache/pegasus-cloudio, so later runs cost one lock): Debian 13 (HTCondor 23.9)
# and Debian testing (HTCondor 25.x, the plugin tests only); the Pegasus tarball unpacked
# there and the wheels the planned-run tests install on the pool's workers (Python 3.13).
pool: $(STAMP) system
	$(HEARTBEAT) "building the HTCondor pool root (Debian 13)" $(PY) -m pegasus_cloudio_testbed.condor_root trixie
	$(HEARTBEAT) "building the HTCondor pool root (Debian testing)" $(PY) -m pegasus_cloudio_testbed.condor_root testing
	$(HEARTBEAT) "unpacking Pegasus 5.1.2, fetching the workers' wheels" $(PY) -m pegasus_cloudio_testbed.pegasus_pool

test: tools pool
	$(PY) -m mypy
	$(PY) -m pytest $(ARGS)
