"""Everything the tests share that is not a fixture (fixtures are tests/conftest.py's), one module per
thing it helps with. Tests import from the module (`from helpers.processes import free_port`); this
package re-exports nothing.

- `environment`: the repository's and tests/js's paths, the PostgreSQL and Redis, the database backends.
- `processes`: free ports, a child `svc-auth`'s environment, starting, stopping and waiting for it.
- `http`: `Api` (pytest-tornado, responses checked by `openapi`), `LiveHttp`, `http`, `basic_auth`.
- `openapi`: every response the suite sees is checked against `GET /v1/openapi.json`.
- `worlds`: `World`, `SmartWorld`, another `clinic`.  `tokens`: tokens signed as a service signs them.
- `launch`: the launch flow over HTTP (`Flow`).  `smart`: SMART apps' launches and refresh tokens.
- `hub`: the sandbox hub over HTTP.  `console`: the developer console's client.
- `rest`: the partner REST API (a partner token, a nightly snapshot).  `charts`: chart ZIPs.
- `fhir_api`: the platform FHIR API.  `fhir_ehr`: the real FHIR EHR (tests/js/fhir_ehr.mjs).
- `hostile_ehr`: a hostile FHIR EHR in a thread.  `r4`: FHIR R4 validation.
- `browser`: Chromium and the demo service.  `partner_app`: the example partner app on a real port.
- `s3`: moto's S3 server, worker settings, a proxy that holds an upload.  `metrics`: Prometheus text.
- `releases`: an earlier release's code and what a database holds.
"""
