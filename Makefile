# Set-up and everyday commands. `make demo` and `make test` are all a new machine needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test lint bench fuzz clean

# The virtual environment is created once and reused; it is rebuilt when setup.py changes.
$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[tf,dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(PY) -m pipeline.demo

# The tests run in one process per logical CPU (pytest-xdist; an idle one takes tests queued for another);
# `make test TEST_WORKERS=0` runs them in one.
TEST_WORKERS ?= logical
test: venv
	$(PY) -m ruff check pipeline transforms tests benchmarks
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal

lint: venv
	$(PY) -m ruff check pipeline transforms tests benchmarks

bench: venv
	$(PY) -m benchmarks.convert_bench --repeat 3
	$(PY) -m benchmarks.per_core --rounds 3
	$(PY) -m benchmarks.parallel_bench --repeat 3

# A long, random fuzzing run of the image layer (make test runs 200 reproducible examples).
FUZZ_EXAMPLES ?= 20000
fuzz: venv
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest tests/test_fuzz_imaging.py -q --timeout=0

clean:
	rm -rf $(VENV) build *.egg-info demo_output
