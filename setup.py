from setuptools import find_namespace_packages, find_packages, setup

# What the service serves besides Python code. The wheel installs these beside the modules, in the
# same layout as the checkout (server.py, static/, sdk/js/dist/, handlers/templates/, ...), so
# paths relative to a module's __file__ work in both. MANIFEST.in puts the same files in the sdist.
# Directories without __init__.py are listed as (namespace) packages so their files can be data.
DATA_PACKAGES = {
    "static": ["**/*"],                                 # the sandbox hub's CSS/JS, Swagger UI for /v1/docs
    "sdk.js.dist": ["*"],                               # the JS SDK's build, served at /static/sdk/
    "handlers": ["templates/*.html"],                   # the sandbox hub and settings pages
    "examples.partner_app": ["static/*", "templates/*"],  # the demo's example partner app
    "examples.smart_app": ["static/*", "static/fhirclient/*"],  # the demo's example SMART app (fhirclient)
}

setup(
    name="svc-auth",
    version="0.7.0",  # CHANGELOG.md: a version per release
    description="OAuth 2.0 / OpenID Connect authorization server and partner REST API for apps embedded in an EHR hub",
    python_requires=">=3.11",
    packages=find_packages(include=["conf*", "errors*", "fhir_api*", "models*", "keys*", "oauth*", "handlers*", "lifecycle*", "cli*",
                                    "ratelimit*", "partner_api*", "workers*", "connectors*", "storage*",
                                    "examples*", "ops*", "runtime*", "app_cache*", "audit*", "billing*", "console*", "hub*",
                                    "hl7feed*", "schedules*", "bulk*"])
    + find_namespace_packages(include=["static", "static.*", "sdk.js.dist"]),
    py_modules=["server"],
    package_data=DATA_PACKAGES,
    include_package_data=True,
    # Exact versions: the code relies on their public APIs as they are in these releases (peewee 4's
    # Database.bind / execute_sql / selected_columns, Tornado's async handlers, Dramatiq 2's Actor).
    # Upgrade deliberately, with the test suite.
    install_requires=[
        "tornado==6.6.1",
        "uvloop==0.22.1",  # serve's event loop: libuv in C under Tornado's asyncio loop, less CPU per request
        # serve's HTTP/1.1 parsing (ops/h11conn.py): llhttp, Node's maintained C parser, which rejects
        # request-smuggling shapes; the connection under Tornado's Application costs less than IOStream.
        "httptools==0.9.0",
        "peewee==4.5.3",
        "python-jose[cryptography]==3.5.0",
        "cryptography==50.0.2",
        "psycopg2-binary==2.9.13",
        "dramatiq[redis]==2.2.1",
        "redis==8.1.0",
        "pyzipper==0.4.0",
        "boto3==1.44.5",
        "fpdf2==2.8.9",
        "prometheus-client==0.26.0",
        "argon2-cffi==25.1.0",  # developer-console passwords: Argon2id, a maintained password hash
        "pyotp==2.12.0",  # the console's optional TOTP second factor (RFC 6238)
        # boto3's HTTP client, pinned to the version it brought in when our own code used it too.
        # Our code uses the standard library's http.client: the EHR transport (connectors/fhir/,
        # since issue 46 item 7) and apps' JWKS fetches (oauth/client_jwks.py, whose deadline closes
        # the socket: urllib3's timeouts are per read).
        "urllib3==2.8.0",
        # The FHIR API's JSON bodies (handlers/fhir.py): a search page of 50 encodes in 27 us against
        # json's 284 us, the same bytes (BENCHMARKS.md, issue 35). The disclosure chain's canonical
        # JSON of a request's record (audit/chain.py): 0.5 us against 4.5, the same bytes for every
        # code point (tests/test_disclosure_audit.py); a new release is pinned only once that test passes.
        "orjson==3.13.0",
    ],
    extras_require={
        "test": [
            "pytest==9.2.0",
            "pytest-tornado==0.8.1",
            # `make test` runs the suite in two processes (`-n 2 --dist loadfile`): it mostly waits on
            # child processes and deadlines, so the wall time halves (3,509 s to 1,723 s, 1,826 tests).
            "pytest-xdist==3.8.0",
            "execnet==2.1.2",  # pytest-xdist's process transport
            "PyJWT[crypto]==2.15.1",
            "jwcrypto==1.6.1",
            "jsonschema==4.26.0",
            "openapi-spec-validator==0.9.0",
            "schemathesis==4.32.5",
            "pypdf==7.1.0",
            "moto[server]==5.2.5",
            "oic==1.7.0",  # pyoidc, an OpenID-certified relying party: interop test
            # Authlib's OAuth/OIDC client (its Flask integration as the relying party), metadata
            # (RFC 8414/9207) and ID token checks: the metadata and OIDC Core interop test.
            "authlib==1.9.9",
            "flask==3.1.3",
            "playwright==1.65.2",  # drives Debian's /usr/bin/chromium for the hub/SDK browser tests
            # Generates a Python client from /v1/openapi.json in tests/test_generated_client.py (the
            # generated code, and its template quirks, change between releases).
            "openapi-python-client==0.29.1",
            # SMART Health IT's Python FHIR client (strict R4 models): reads and searches the platform
            # FHIR API in tests/test_fhir_api_clients.py.
            "fhirclient==4.4.0",
            "build==1.6.1",  # builds the sdist and wheel in the packaging test (tests/test_packaging.py)
            # The build backend `build --no-isolation` uses there (offline); below 81, which dropped
            # pkg_resources that pytest-tornado imports.
            "setuptools==80.10.2",
            "wheel==0.48.0",
            # python-hl7: an HL7v2 library nobody here wrote sends the SIU feed's messages over
            # MLLP in tests/test_hl7_feed.py (hl7.client.MLLPClient; hl7.mllp with TLS) and
            # parses our ACKs.
            "hl7==0.4.5",
        ],
    },
    entry_points={"console_scripts": ["svc-auth=cli:main"]},
)
