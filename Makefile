# Every target installs what it needs into .venv by itself.
PY_SYS ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test test-all test-cuda lint format bench demo demo-headless tmux netlab-tools image clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# tmux runs the local testnet (demo, testnet tests); installed from the system's packages if absent.
tmux:
	@command -v tmux >/dev/null 2>&1 || { \
	  echo "tmux not found: installing it with apt-get" >&2; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq tmux >/dev/null; } || { \
	  echo "tmux is required: install it with your package manager" >&2; exit 1; }

# ip, iptables and tc build the network lab (bench/harness/netlab; as root); installed like tmux. Without
# root nothing is installed and the lab tests skip, saying why.
netlab-tools:
	@[ "$$(id -u)" != 0 ] || { command -v ip >/dev/null 2>&1 && command -v iptables >/dev/null 2>&1 \
	  && command -v tc >/dev/null 2>&1; } || { \
	  echo "ip/iptables/tc not found: installing iproute2 and iptables with apt-get" >&2; \
	  apt-get update -qq && apt-get install -y -qq iproute2 iptables >/dev/null; } || { \
	  echo "could not install iproute2/iptables: the network-lab tests will skip" >&2; }

# The container image localhost/psyche:latest, built with podman from a Debian base made here (no
# registry): container/build.sh installs podman, runc and mmdebstrap with apt-get if absent (as
# root, through sudo otherwise), reuses build/image/base.tar and podman's layer cache.
image:
	container/build.sh

test: $(STAMP) tmux netlab-tools
	$(PY) -m pytest -m "not slow" -q --durations=30

test-all: $(STAMP) tmux netlab-tools
	$(PY) -m pytest -q --durations=30

# The GPU suite (docs/client.md, "Running on a GPU"): the tests marked `cuda` (tests/cuda and
# a few unit tests); each skips, saying why, without a CUDA device (or with one where it needs
# two). `make test` collects them too.
test-cuda: $(STAMP)
	$(PY) -m pytest -m cuda -v -rs --durations=10

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b" >&2; $(PY) $$b || exit 1; done

# In a terminal: attaches to tmux (detach with Ctrl-b d to stop). Without one (CI, scripts):
# runs headless for a few minutes and prints the summary.
demo: $(STAMP) tmux
	@if [ -t 0 ] && [ -t 1 ]; then \
	  $(VENV)/bin/psyche-local-testnet start --num-clients 3; \
	else \
	  $(MAKE) --no-print-directory demo-headless; \
	fi

demo-headless: $(STAMP) tmux
	$(VENV)/bin/psyche-local-testnet start --num-clients 3 --headless --duration 240

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
