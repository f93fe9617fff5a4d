# Set-up and everyday commands. `make demo` and `make test` are all a new machine needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test lint bench clean

# The virtual environment is created once and reused; it is rebuilt when setup.py changes.
$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[tf,dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(PY) -m pipeline.demo

test: venv
	$(PY) -m ruff check pipeline transforms tests benchmarks
	$(PY) -m pytest

lint: venv
	$(PY) -m ruff check pipeline transforms tests benchmarks

bench: venv
	$(PY) -m benchmarks.convert_bench

clean:
	rm -rf $(VENV) build *.egg-info demo_output
