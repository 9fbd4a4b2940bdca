# Two commands on a fresh machine: `make tour` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
COURSE := $(VENV)/.course

.PHONY: tour test lab course install clean

# The developer's install (`make tour`, `make test`): torch's CPU build, the package with its test, notebook, peer
# and site extras (tools/install.sh says how torch's CPU build is found)
$(STAMP): pyproject.toml tools/install.sh
	PYTHON=$(PYTHON) tools/install.sh --venv $(VENV) --extras test,notebooks,peers,site -- deepspeed==0.19.8 pytest-xdist==3.8.0
	@# DeepSpeed compiles its CPU communication op on first use (about a minute): once here, not in the tour
	DS_ACCELERATOR=cpu $(PY) -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
	touch $(STAMP)

# The learner's install (`make course`, `make lab`): torch's CPU build and the course's needs only (JupyterLab)
$(COURSE): pyproject.toml tools/install.sh
	PYTHON=$(PYTHON) tools/install.sh --venv $(VENV) --extras notebooks
	touch $(COURSE)

course: $(COURSE)

install: $(STAMP)

tour: $(STAMP)
	$(VENV)/bin/zerokit tour

# Two passes: everything but the `serial` tests on two workers (each test file, notebooks included, stays on
# one worker, in order), then the `serial` ones alone — they hold wall-clock times to bounds.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not serial"
	$(PY) -m pytest -q -m serial

# JupyterLab at the repository's root, opened at notebooks/ (tools/lab.sh: loopback, root allowed, no news prompt)
lab: $(COURSE)
	PYTHON=$(PY) tools/lab.sh

clean:
	rm -rf $(VENV) .pytest_cache

# The course as a static site in build/site/, from the committed notebooks (tools/build_site.py; no network)
.PHONY: site
site: $(STAMP)
	$(PY) tools/build_site.py

# The learner's bundle: git's files less solutions/, tests/ and .ci/ (tools/release.py), the system's Python
.PHONY: release
release:
	$(PYTHON) tools/release.py
