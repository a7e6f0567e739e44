from setuptools import find_packages, setup

setup(
    name="svc-auth",
    version="0.1.0",
    description="OAuth 2.0 / OpenID Connect authorization server and partner REST API for apps embedded in an EHR hub",
    python_requires=">=3.11",
    packages=find_packages(include=["conf*", "models*", "keys*", "oauth*", "handlers*", "lifecycle*", "cli*",
                                    "ratelimit*", "partner_api*", "workers*", "connectors*", "storage*",
                                    "examples*", "ops*", "runtime*"]),
    py_modules=["server"],
    include_package_data=True,
    # Exact versions: the code relies on their public APIs as they are in these releases (peewee 4's
    # Database.bind / execute_sql / selected_columns, Tornado's async handlers, Dramatiq 2's Actor).
    # Upgrade deliberately, with the test suite.
    install_requires=[
        "tornado==6.6.1",
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
    ],
    extras_require={
        "test": [
            "pytest==9.2.0",
            "pytest-tornado==0.8.1",
            "PyJWT[crypto]==2.15.1",
            "jwcrypto==1.6.1",
            "jsonschema==4.26.0",
            "openapi-spec-validator==0.9.0",
            "schemathesis==4.32.5",
            "pypdf==7.1.0",
            "moto[server]==5.2.5",
            "oic==1.7.0",  # pyoidc, an OpenID-certified relying party: interop test
            "playwright==1.65.2",  # drives Debian's /usr/bin/chromium for the hub/SDK browser tests
        ],
    },
    entry_points={"console_scripts": ["svc-auth=cli:main"]},
)
