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
}

setup(
    name="svc-auth",
    version="0.1.0",
    description="OAuth 2.0 / OpenID Connect authorization server and partner REST API for apps embedded in an EHR hub",
    python_requires=">=3.11",
    packages=find_packages(include=["conf*", "models*", "keys*", "oauth*", "handlers*", "lifecycle*", "cli*",
                                    "ratelimit*", "partner_api*", "workers*", "connectors*", "storage*",
                                    "examples*", "ops*"])
    + find_namespace_packages(include=["static", "static.*", "sdk.js.dist"]),
    py_modules=["server"],
    package_data=DATA_PACKAGES,
    include_package_data=True,
    install_requires=[
        "tornado>=6.4",
        "peewee>=3.17",
        "python-jose[cryptography]>=3.3",
        "cryptography>=42",
        "psycopg2-binary>=2.9",
        "dramatiq[redis]>=1.16",
        "redis>=5",
        "pyzipper>=0.3.6",
        "boto3>=1.34",
        "fpdf2>=2.7",
        "prometheus-client>=0.20",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-tornado>=0.8",
            "PyJWT[crypto]>=2.8",
            "jwcrypto>=1.5",
            "jsonschema>=4.21",
            "openapi-spec-validator>=0.7",
            "schemathesis>=4",
            "pypdf>=4",
            "moto[server]>=5",
            "oic>=1.7",  # pyoidc, an OpenID-certified relying party: interop test
            "playwright>=1.45",  # drives Debian's /usr/bin/chromium for the hub/SDK browser tests
            # Generates a Python client from /v1/openapi.json in tests/test_generated_client.py; pinned
            # because the generated code (and its known template quirks) changes between releases.
            "openapi-python-client==0.29.1",
            "build>=1.2",  # builds the sdist and wheel in the packaging test (tests/test_packaging.py)
            # The build backend `build --no-isolation` uses there (offline); below 81, which dropped
            # pkg_resources that pytest-tornado imports.
            "setuptools>=69,<81",
            "wheel>=0.43",
        ],
    },
    entry_points={"console_scripts": ["svc-auth=cli:main"]},
)
