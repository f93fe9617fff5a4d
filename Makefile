# Set-up and everyday commands. `make demo` and `make test` are all a new machine needs.
PYTHON ?= python3
comma := ,
VENV ?= .venv
PY := $(VENV)/bin/python
# The same range as setup.py's python_requires (tests/test_makefile.py checks that they agree).
SUPPORTED := 3.11 3.12 3.13
VERSION_OF = $(shell $(1) -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)
# $(PYTHON)'s version, e.g. 3.13.0 (empty if it does not run). The stamp names it, so that another interpreter
# (make demo PYTHON=python3.13 after a .venv of 3.11) is noticed even when setup.py has not changed.
PYTHON_VERSION := $(call VERSION_OF,$(PYTHON))
STAMP := $(VENV)/.installed-python$(PYTHON_VERSION)

# An unsupported $(PYTHON) is refused in one line, by every target but clean.
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),venv)),)
ifeq ($(filter $(SUPPORTED),$(basename $(PYTHON_VERSION))),)
$(error $(PYTHON) is $(if $(PYTHON_VERSION),Python $(PYTHON_VERSION),not a Python that runs here); image-tfrecords \
  supports Python $(subst $() ,$(comma) ,$(SUPPORTED)): give one, e.g. make $(firstword $(MAKECMDGOALS) venv) \
  PYTHON=python3.12)
endif
endif

.PHONY: venv demo test lint bench fuzz clean

# The virtual environment is created once and reused; it is updated when setup.py changes, and built anew when
# $(PYTHON) is another Python version than the one that built it.
$(STAMP): setup.py
	@if [ -e $(VENV) ] && [ "$(call VERSION_OF,$(PY))" != "$(PYTHON_VERSION)" ]; then \
	  echo "$(VENV) was built by another Python: building it anew with $(PYTHON) ($(PYTHON_VERSION))"; \
	  rm -rf $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[tf,dev]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(PY) -m pipeline.demo

# The tests run in one process per logical CPU (pytest-xdist; an idle one takes tests queued for another);
# `make test TEST_WORKERS=0` runs them in one. The 25 slowest are listed at the end (where the suite's time goes).
TEST_WORKERS ?= logical
test: venv
	$(PY) -m ruff check pipeline transforms tests benchmarks
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=25

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
