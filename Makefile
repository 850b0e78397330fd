# Two entry points: `make demo` (main job on the embedded local stack) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m localstack.demo $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS) tests

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
