# svc-auth: `make demo` runs the service with demo data; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install system-deps bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): setup.py | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# The `jose` npm package, for the test that verifies our ID tokens from JavaScript.
tests/js/node_modules/.package-lock.json: tests/js/package.json tests/js/package-lock.json
	cd tests/js && npm ci --silent --no-audit --no-fund

install: $(STAMP)

# Debian packages the browser and proxy tests need (installed once; skipped when present).
system-deps:
	@if ! command -v chromium >/dev/null || ! command -v nginx >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium nginx-light >/dev/null; \
	  else echo "install Debian's chromium and nginx-light for the browser and proxy tests"; fi; fi

demo: install
	$(BIN)/svc-auth serve --demo

test: install system-deps tests/js/node_modules/.package-lock.json
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) var .pytest_cache
