from setuptools import find_packages, setup

setup(
    name="svc-auth",
    version="0.1.0",
    description="OAuth 2.0 / OpenID Connect authorization server and partner REST API for apps embedded in an EHR hub",
    python_requires=">=3.11",
    packages=find_packages(include=["conf*", "models*", "keys*", "oauth*", "handlers*", "lifecycle*", "cli*",
                                    "ratelimit*", "partner_api*", "workers*", "connectors*", "storage*",
                                    "examples*", "ops*"]),
    py_modules=["server"],
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
        "argon2-cffi>=23.1,<26",  # developer-console passwords: Argon2id, a maintained password hash
        "pyotp>=2.9,<3",  # the console's optional TOTP second factor (RFC 6238)
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
        ],
    },
    entry_points={"console_scripts": ["svc-auth=cli:main"]},
)
