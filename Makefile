# The README's two commands: `make demo` and `make test`. Both create .venv on
# a fresh machine and install the project into it first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-figure test install bench clean

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/vitsweep demo

demo-figure: $(STAMP)  # after `make demo`: the README's figure and its data (docs/demo_training_curves.*)
	$(PY) bench/demo_figure.py --results results

test: $(STAMP)  # the linter and the spec's type check first: seconds, where the suite takes minutes
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest tests

bench: $(STAMP)
	$(PY) bench/model_throughput.py
	$(PY) bench/input_pipeline.py
	$(PY) bench/metrics_throughput.py
	$(PY) bench/packing.py
	$(PY) bench/host_syncs.py
	$(PY) bench/sweep_overhead.py

clean:
	rm -rf results .pytest_cache
