# svc-auth: `make demo` runs the service with demo data; `make test` runs every test.
PYTHON ?= python3
# `make demo PORT=9000 APP_PORT=9001`: the service's and the example partner app's ports.
PORT ?= 8888
APP_PORT ?= 8889
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install sdk vendor-swagger-ui vendor-fhirclient system-deps bench-deps bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): setup.py | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# npm packages of the tests: `jose` (verifies our ID tokens from JavaScript), `axe-core` (console accessibility).
tests/js/node_modules/.package-lock.json: tests/js/package.json tests/js/package-lock.json
	cd tests/js && npm ci --silent --no-audit --no-fund

# The SDK package's build and type-check tools (esbuild, typescript), pinned by its package-lock.json.
sdk/js/node_modules/.package-lock.json: sdk/js/package.json sdk/js/package-lock.json
	cd sdk/js && npm ci --silent --no-audit --no-fund

# Rebuild the SDK's committed dist/ (the service serves dist/svc-sdk.js) after changing sdk/js/src/.
sdk: sdk/js/node_modules/.package-lock.json
	cd sdk/js && npm run --silent build

# /v1/docs is Swagger UI from npm `swagger-ui-dist`, committed under static/docs/swagger-ui/ (with its
# licence); this target re-vendors it (change the version here, run it, commit the files).
SWAGGER_UI_VERSION := 5.35.0
SWAGGER_UI_FILES := swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css LICENSE NOTICE \
	favicon-32x32.png package.json
vendor-swagger-ui:
	tmp=$$(mktemp -d) && (cd $$tmp && npm pack --silent swagger-ui-dist@$(SWAGGER_UI_VERSION) >/dev/null && \
	  tar xzf swagger-ui-dist-$(SWAGGER_UI_VERSION).tgz) && \
	  (cd $$tmp/package && cp $(SWAGGER_UI_FILES) $(CURDIR)/static/docs/swagger-ui/) && rm -rf $$tmp

# The example SMART app (examples/smart_app/) runs SMART Health IT's npm `fhirclient` in the browser:
# its browser build (no polyfills: modern browsers) is committed under static/fhirclient/ with its
# licence; this target re-vendors the version pinned in examples/smart_app/package.json (npm pack
# checks the tarball's integrity against the registry).
FHIRCLIENT_VERSION := $(shell sed -n 's/.*"fhirclient": "\([^"]*\)".*/\1/p' examples/smart_app/package.json)
FHIRCLIENT_DIR := examples/smart_app/static/fhirclient
vendor-fhirclient:
	tmp=$$(mktemp -d) && (cd $$tmp && npm pack --silent fhirclient@$(FHIRCLIENT_VERSION) >/dev/null && \
	  tar xzf fhirclient-$(FHIRCLIENT_VERSION).tgz) && \
	  (cd $$tmp/package && cp build/fhir-client.pure.min.js build/fhir-client.pure.min.js.LICENSE.txt LICENSE \
	    package.json $(CURDIR)/$(FHIRCLIENT_DIR)/) && rm -rf $$tmp

install: $(STAMP)

# Debian packages the browser, proxy and load-balancer tests need (installed once; skipped when present).
system-deps:
	@if ! command -v chromium >/dev/null || ! command -v nginx >/dev/null || ! command -v haproxy >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium nginx-light haproxy >/dev/null; \
	  else echo "install Debian's chromium, nginx-light and haproxy for the browser and proxy tests"; fi; fi

demo: install
	$(BIN)/svc-auth serve --demo --port $(PORT) --demo-app-port $(APP_PORT)

# The tests mostly wait (on child processes, deadlines, kills), so two pytest processes halve the
# wall time on two cores; each test file runs whole in one of them (its module fixtures once).
# Tests marked `serial` (pytest.ini) measure how processes share work, which the other pytest
# process's CPU load would skew: they run alone, after the others.
# `make test TEST_WORKERS=0` runs the first part in this process too.
TEST_WORKERS ?= 2
test: install system-deps tests/js/node_modules/.package-lock.json sdk/js/node_modules/.package-lock.json
	cd sdk/js && npm test --silent
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -m serial

# The load generator (wrk) and nginx (the load generator's own ceiling) for `make bench`; the
# appointments and snapshot benchmarks need PostgreSQL and Redis (BENCH_POSTGRES_URL, BENCH_REDIS_URL;
# installed and started here when missing, else those two sections are skipped with the reason).
bench-deps:
	@if ! command -v wrk >/dev/null || ! command -v nginx >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light >/dev/null; \
	  else echo "install Debian's wrk and nginx-light for the benchmarks"; fi; fi
	@if [ -z "$$BENCH_POSTGRES_URL" ] && ! command -v pg_ctlcluster >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql redis-server >/dev/null; \
	  pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start 2>/dev/null || true; \
	  su postgres -c "psql -qc \"ALTER USER postgres PASSWORD 'postgres'\"" 2>/dev/null || true; \
	  (redis-cli ping >/dev/null 2>&1 || redis-server --daemonize yes >/dev/null); fi

# The bench's peer, node-oidc-provider on PostgreSQL (bench/js/oidc_peer.mjs), pinned by bench/js's package-lock.json.
bench/js/node_modules/.package-lock.json: bench/js/package.json bench/js/package-lock.json
	cd bench/js && npm ci --silent --no-audit --no-fund

bench: install bench-deps tests/js/node_modules/.package-lock.json bench/js/node_modules/.package-lock.json
	$(BIN)/pip install -q 'py-spy>=0.3'  # the profile of the remote_db section
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) var .pytest_cache
