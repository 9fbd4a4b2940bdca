# Two commands on a fresh machine: `make tour` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: tour test lab install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,notebooks,peers]' torch==2.13.0 deepspeed==0.19.8 pytest-xdist==3.8.0
	@# DeepSpeed compiles its CPU communication op on first use (about a minute): once here, not in the tour
	DS_ACCELERATOR=cpu $(PY) -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
	touch $(STAMP)

install: $(STAMP)

tour: $(STAMP)
	$(VENV)/bin/zerokit tour

# Two passes: everything but the `serial` tests on two workers (each test file, notebooks included, stays on
# one worker, in order), then the `serial` ones alone — they hold wall-clock times to bounds.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not serial"
	$(PY) -m pytest -q -m serial

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 notebooks/

clean:
	rm -rf $(VENV) .pytest_cache
