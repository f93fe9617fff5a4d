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
# The tf-models-official the tests decode detection records with (2.20.0: its TfExampleDecoder reads masks).
MODEL_GARDEN_VERSION := 2.20.0

# An unsupported $(PYTHON) is refused in one line, by every target but clean.
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),venv)),)
ifeq ($(filter $(SUPPORTED),$(basename $(PYTHON_VERSION))),)
$(error $(PYTHON) is $(if $(PYTHON_VERSION),Python $(PYTHON_VERSION),not a Python that runs here); image-tfrecords \
  supports Python $(subst $() ,$(comma) ,$(SUPPORTED)): give one, e.g. make $(firstword $(MAKECMDGOALS) venv) \
  PYTHON=python3.12)
endif
endif

# The Pythons `make test` runs the suite on, each in its own virtual environment: none given (a developer's
# make test), the suite runs once, in .venv with $(PYTHON); under CI (CI=true) the oldest and the newest of
# SUPPORTED; or as given: make test TEST_PYTHONS="3.11 3.13".
CI_RUN := $(filter true 1,$(CI))
ifneq ($(CI_RUN),)
TEST_PYTHONS ?= $(firstword $(SUPPORTED)) $(lastword $(SUPPORTED))
endif
ifneq ($(filter test,$(MAKECMDGOALS)),)
ifneq ($(filter-out $(SUPPORTED),$(TEST_PYTHONS)),)
$(error TEST_PYTHONS names Python $(filter-out $(SUPPORTED),$(TEST_PYTHONS)); image-tfrecords supports Python \
  $(subst $() ,$(comma) ,$(SUPPORTED)): give versions such as make test TEST_PYTHONS="3.11 3.13")
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
	# Model Garden's detection decoder, a consumer the tests read detection records with
	# (tests/test_detection_records.py): in a folder of its own, without its dependencies (it pins TensorFlow
	# versions of its own), on no path but the test's.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --upgrade --target $(VENV)/model-garden \
	  "tf-models-official==$(MODEL_GARDEN_VERSION)"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)
	@:

demo: venv
	$(PY) -m pipeline.demo

# The tests run in one process more than the CPUs this process may use (pytest-xdist; an idle one takes tests
# queued for another): part of the suite waits (on subprocesses, the stand-in servers, the runs' own bounded
# waits), and one more worker keeps the cores busy meanwhile (2 cores, 2026-12-04: 5 min 52 s with 3 workers, CPU
# 185 %, against 6 min 34 s with 2). `make test TEST_WORKERS=0` runs them in one. The 25 slowest are listed at the
# end (where the suite's time goes).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$((n + 1)))
PYTEST_ARGS = -n $(TEST_WORKERS) --dist worksteal --durations=25
# The interpreter of Python $$v (in the shell variable py, empty if none): $(PYTHON) if it is that version, else
# python$$v on the PATH, else pyenv's (`pyenv prefix $$v`, ~/.pyenv/versions/$$v*): the first that runs as $$v
# (a pyenv shim of a version that is not selected does not).
FIND_PYTHON = py=; prefix=$$(pyenv prefix $$v 2>/dev/null); \
  for c in "$(PYTHON)" "$$(command -v python$$v)" $${prefix:+"$$prefix/bin/python$$v"} \
      $$HOME/.pyenv/versions/$$v*/bin/python$$v; do \
    [ "$$("$$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$$v" ] && { py=$$c; break; }; \
  done
# The suite starts hundreds of interpreters (conversions, launches, stand-in workers); each reuses the compiled
# modules of the checkout and the tests, and pytest its rewritten test modules, cached beside the venv (where
# PYTHONDONTWRITEBYTECODE is set, every one of them compiled everything again: collection alone took twice as long).
test: export PYTHONDONTWRITEBYTECODE :=
test: export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache
test: venv
	$(PY) -m ruff check pipeline transforms tests benchmarks
ifeq ($(strip $(TEST_PYTHONS)),)
	$(PY) -m pytest $(PYTEST_ARGS)
else
# The lint once, then the suite once per Python: $(PYTHON)'s in $(VENV), another one in $(VENV)-3.N (built and
# reused like $(VENV)). Every run happens even if one before it failed; the last line names the ones that failed.
	@failed=; skipped=; passed=; for v in $(TEST_PYTHONS); do \
	  $(FIND_PYTHON); \
	  if [ -z "$$py" ]; then \
	    echo "make test: Python $$v not found (no python$$v on the PATH, none under pyenv): install it" \
	      "(pyenv install $$v) or put python$$v on the PATH$(if $(CI_RUN),, - the suite is not run on it)"; \
	    $(if $(CI_RUN),failed="$$failed $$v (not found)",skipped="$$skipped $$v"); continue; \
	  fi; \
	  if [ "$$py" = "$(PYTHON)" ]; then venv=$(VENV); else venv=$(VENV)-$$v; fi; \
	  echo "make test: the suite on Python $$v ($$py, in $$venv)"; \
	  if $(MAKE) --no-print-directory venv PYTHON="$$py" VENV=$$venv && \
	     $$venv/bin/python -m pytest $(PYTEST_ARGS); then passed="$$passed $$v"; else failed="$$failed $$v"; fi; \
	done; \
	if [ -n "$$failed" ]; then \
	  echo "make test: failed on Python$$failed$${passed:+ (passed on$$passed)}$${skipped:+ (not run on$$skipped)}"; \
	  exit 1; fi; \
	if [ -z "$$passed" ]; then echo "make test: the suite ran on none of Python $(TEST_PYTHONS)"; exit 1; fi; \
	echo "make test: passed on Python$$passed$${skipped:+ (not run on$$skipped: not found)}"
endif

lint: venv
	$(PY) -m ruff check pipeline transforms tests benchmarks

# img2dataset's Resizer is the per-core benchmark's peer: its module alone (--no-deps; see benchmarks/per_core.py).
bench: venv
	$(PY) -m pip show --quiet img2dataset 2>/dev/null || $(PY) -m pip install --quiet --disable-pip-version-check \
	  --no-deps "img2dataset>=1.45,<2"
	$(PY) -m benchmarks.convert_bench --repeat 3
	$(PY) -m benchmarks.per_core --rounds 3
	$(PY) -m benchmarks.parallel_bench --repeat 3

# A long, random fuzzing run of the image layer (make test runs 200 reproducible examples).
FUZZ_EXAMPLES ?= 20000
fuzz: venv
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest tests/test_fuzz_imaging.py -q --timeout=0

clean:
	rm -rf $(VENV) $(VENV)-3.* build *.egg-info demo_output
