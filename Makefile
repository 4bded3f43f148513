# Two entry points: `make demo` (the main job) and `make test` (the suite).
# Both create .venv when it is missing and install daskpri with the pinned
# versions of constraints.txt, so a fresh clone needs nothing installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint bench-table install clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/daskpri demo

# The suite's test files run on TEST_WORKERS processes (pytest-xdist), a file's tests on
# one, so that a module's cluster fixture is made once; TEST_WORKERS=0 runs them in this one.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" --doctest-modules tests daskpri

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check daskpri tests
	$(BIN)/mypy daskpri

bench-table: $(STAMP)
	$(BIN)/python benchmarks/table_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
