# Every target installs what it needs into .venv by itself.
PY_SYS ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test test-all lint format bench demo clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

test-all: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b" >&2; $(PY) $$b || exit 1; done

demo: $(STAMP)
	$(VENV)/bin/psyche-local-testnet start --num-clients 3

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
