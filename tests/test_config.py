"""Settings: every variable of CONTRACTS.md, validated with a message naming the variable."""
import pytest

from conf import ConfigError, Settings


def test_defaults_match_the_contract():
    s = Settings.from_env({}, dotenv=None)
    assert s.issuer == "http://127.0.0.1:8888" and s.public_url == s.issuer
    assert s.database_url == "sqlite:///var/svc-auth.db" and s.redis_url == ""
    assert s.claims_namespace == "127.0.0.1" and s.demo_application_id == "demo-application"
    assert s.sync_window == "02:00-04:00" and s.issuer_claim == "http://127.0.0.1:8888/"
    assert (s.code_ttl, s.launch_ttl, s.access_token_ttl, s.id_token_ttl, s.sandbox_token_ttl,
            s.presigned_url_ttl) == (60, 300, 300, 3600, 1800, 900)
    assert s.keys_dir == "var/keys" and s.objects_dir == "var/objects"
    assert (s.console_idle_timeout, s.console_session_lifetime) == (1800, 12 * 3600)
    assert (s.chart_build_deadline, s.snapshot_build_deadline) == (1800, 1800)


def test_environment_and_dotenv(tmp_path):
    dotenv = tmp_path / ".env"
    dotenv.write_text('# comment\nSVC_ISSUER="https://auth.example.com/"\nexport SVC_CODE_TTL=30\n')
    s = Settings.from_env({"SVC_CODE_TTL": "45"}, dotenv=dotenv)
    assert s.issuer == "https://auth.example.com" and s.claims_namespace == "auth.example.com"
    assert s.code_ttl == 45  # the environment wins over the file


def test_a_url_s_scheme_is_read_in_lower_case():
    """`HTTPS://` is https (RFC 3986 3.1): the cookies' `Secure` and every origin check read it so."""
    s = Settings.from_env({"SVC_ISSUER": "HTTPS://auth.example.com/", "SVC_PUBLIC_URL": "Https://hub.example.com"},
                          dotenv=None)
    assert (s.issuer, s.public_url) == ("https://auth.example.com", "https://hub.example.com")


@pytest.mark.parametrize("env,name", [
    ({"SVC_ISSUER": "auth.example.com"}, "SVC_ISSUER"),
    ({"SVC_DATABASE_URL": "mysql://x"}, "SVC_DATABASE_URL"),
    ({"SVC_REDIS_URL": "http://x"}, "SVC_REDIS_URL"),
    ({"SVC_SYNC_WINDOW": "2-4"}, "SVC_SYNC_WINDOW"),
    ({"SVC_CODE_TTL": "soon"}, "SVC_CODE_TTL"),
    ({"SVC_ACCESS_TOKEN_TTL": "-5"}, "SVC_ACCESS_TOKEN_TTL"),
    ({"SVC_S3_ENDPOINT_URL": "http://127.0.0.1:9000"}, "SVC_S3_BUCKET"),
    ({"SVC_REST_ALLOWED_NETWORKS": "10.0.0.0/8,banana"}, "SVC_REST_ALLOWED_NETWORKS"),
    ({"SVC_EHR_INTERACTIVE_DEADLINE": "0"}, "SVC_EHR_INTERACTIVE_DEADLINE"),
    ({"SVC_EHR_BATCH_MAX_PAGES": "many"}, "SVC_EHR_BATCH_MAX_PAGES"),
    ({"SVC_EHR_BATCH_MAX_BYTES": "-1"}, "SVC_EHR_BATCH_MAX_BYTES"),
    ({"SVC_REDIS_NAMESPACE": "svc-auth\n"}, "SVC_REDIS_NAMESPACE"),  # matched whole: no final newline
    ({"SVC_SNAPSHOT_BUILD_DEADLINE": "0"}, "SVC_SNAPSHOT_BUILD_DEADLINE"),
    ({"SVC_SNAPSHOT_BUILD_DEADLINE": "30m"}, "SVC_SNAPSHOT_BUILD_DEADLINE"),
    ({"SVC_CONSOLE_SESSION_LIFETIME": "0"}, "SVC_CONSOLE_SESSION_LIFETIME"),
    ({"SVC_CONSOLE_SESSION_LIFETIME": "12h"}, "SVC_CONSOLE_SESSION_LIFETIME"),
    ({"SVC_HL7_MAX_CONNECTIONS_PER_PEER": "0"}, "SVC_HL7_MAX_CONNECTIONS_PER_PEER"),
    ({"SVC_HL7_MAX_CONNECTIONS_PER_PEER": "lots"}, "SVC_HL7_MAX_CONNECTIONS_PER_PEER"),
    # no upper bound: a date past year 9999 on the first token, threads started without end
    ({"SVC_ACCESS_TOKEN_TTL": str(10 ** 12)}, "SVC_ACCESS_TOKEN_TTL"),
    ({"SVC_DISCLOSURE_RETENTION_DAYS": str(10 ** 7)}, "SVC_DISCLOSURE_RETENTION_DAYS"),
    ({"SVC_WORKER_THREADS": str(2 ** 64)}, "SVC_WORKER_THREADS"),
    ({"SVC_DB_THREADS": "100000"}, "SVC_DB_THREADS"),
    ({"SVC_TASK_MAX_BACKOFF_MS": str(10 ** 15)}, "SVC_TASK_MAX_BACKOFF_MS"),
    ({"SVC_PRESIGNED_URL_TTL": str(7 * 86400 + 1)}, "SVC_PRESIGNED_URL_TTL"),  # S3 refuses such URLs
])
def test_bad_values_are_refused_naming_the_variable(env, name):
    with pytest.raises(ConfigError, match=name):
        Settings.from_env(env, dotenv=None)


def test_key_prepublication_bounds_the_jwks_cache_lifetime():
    assert Settings.build().key_prepublish_seconds == 300 and Settings.build().jwks_max_age == 150
    assert Settings.build(key_prepublish_seconds="60").jwks_max_age == 30  # half: a margin for reloads and clocks
    assert Settings.build(key_prepublish_seconds="3600").jwks_max_age == 300
    assert Settings.build(key_prepublish_seconds="0").jwks_max_age == 0
    with pytest.raises(ConfigError, match="SVC_KEY_PREPUBLISH_SECONDS"):
        Settings.build(key_prepublish_seconds="-1")


def test_the_hl7_per_peer_cap_defaults_to_a_quarter_of_the_listeners():
    assert (Settings.build().hl7_max_connections, Settings.build().hl7_max_connections_per_peer) == (200, 50)
    assert Settings.from_env({"SVC_HL7_MAX_CONNECTIONS": "40"}, dotenv=None).hl7_max_connections_per_peer == 10
    assert Settings.from_env({"SVC_HL7_MAX_CONNECTIONS": "2"}, dotenv=None).hl7_max_connections_per_peer == 1
    assert Settings.from_env({"SVC_HL7_MAX_CONNECTIONS_PER_PEER": "7"}, dotenv=None).hl7_max_connections_per_peer == 7


def test_every_setting_is_in_the_readme_configuration_table_and_the_allowlist_in_env_example():
    """README's configuration table names every SVC_* variable Settings reads (it lacked seven), and
    deploy/env.example names SVC_REST_ALLOWED_NETWORKS, which docs/security.md says to set."""
    import dataclasses
    from helpers.environment import ROOT
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Configuration", 1)[1].split("\n\n### ", 1)[0]
    rows = "\n".join(line.split(" | ", 1)[0] for line in table.splitlines() if line.startswith("| `SVC_"))
    absent = [name for name in ("SVC_" + f.name.upper() for f in dataclasses.fields(Settings))
              if f"`{name}`" not in rows and name != "SVC_DB_THREADS"]  # SVC_DB_THREADS: the paragraph below it
    assert absent == []
    assert "`SVC_DB_THREADS`" in table
    example = (ROOT / "deploy" / "env.example").read_text()
    assert "SVC_REST_ALLOWED_NETWORKS" in (ROOT / "docs" / "security.md").read_text()
    assert "# SVC_REST_ALLOWED_NETWORKS=" in example
