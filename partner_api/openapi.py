"""The OpenAPI 3.1 document of the partner REST API and the OAuth endpoints (`GET /v1/openapi.json`).

Kept as Python so the repeated parts (errors, rate-limit headers, both OAuth address variants)
are written once. `tests/helpers/openapi.py` validates every response the test suite sees
against it, and a schemathesis run fuzzes the live service with it.
"""
from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from types import MappingProxyType

from connectors.base import APPOINTMENT_STATUSES, LISTED_STATUSES
from lifecycle.billing import MONTH
from models.application import ACTIVATION_STATUSES
from models.ids import ID_PATTERN
from models.npi import NPI_PATTERN
from partner_api.appointments import MAX_LIMIT

VERSION = "1.0.0"
NULLABLE_STRING = MappingProxyType({"type": ["string", "null"]})
DATE_TIME = MappingProxyType({"type": "string", "format": "date-time"})
NULLABLE_DATE_TIME = MappingProxyType({"type": ["string", "null"], "format": "date-time"})


TOKEN_REQUEST_FIELDS = MappingProxyType({
    "grant_type": {"type": "string", "enum": ["authorization_code", "client_credentials", "refresh_token"],
                   "description": "`client_credentials` at /v1 only; `refresh_token`: a SMART app's refresh token"},
    "code": {"type": "string", "description": "authorization_code: the code from the authorize redirect"},
    "redirect_uri": {"type": "string", "description": "authorization_code: when the authorize request had one"},
    "client_id": {"type": "string", "description": "client authentication in the body (else HTTP Basic); a public "
                                                   "client sends client_id alone"},
    "client_secret": {"type": "string", "description": "never for a public client (it has none)"},
    "code_verifier": {"type": "string", "description": "authorization_code: the PKCE verifier (RFC 7636)"},
    "refresh_token": {"type": "string", "description": "refresh_token: the SMART app's current refresh token"},
    "scope": {"type": "string", "description": "refresh_token: the same or a narrower scope (default: the grant's); "
                                               "client_credentials with a client assertion: the system scopes asked "
                                               "(required)"},
    "client_assertion_type": {"type": "string", "enum": ["urn:ietf:params:oauth:client-assertion-type:jwt-bearer"],
                              "description": "private_key_jwt (RFC 7523): a backend app authenticates with a key pair"},
    "client_assertion": {"type": "string", "description": "private_key_jwt: the JWT the backend app signed (RS384 or "
                                                          "ES384) with a key of its registered JWKS"},
})


def _plain(value):
    """`value` with every read-only mapping (the constants above) as a plain dict, recursively."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _object(properties: dict, required: list | None = None, additional: bool = False) -> dict:
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required, "additionalProperties": additional}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


SCHEMAS = MappingProxyType({
    "Error": {"type": "object", "required": ["error", "message"], "properties": {
        "error": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$", "description": "snake_case error code"},
        "message": {"type": "string", "description": "a sentence for people"},
        "error_description": {"type": "string", "description": "OAuth endpoints: RFC 6749 5.2 description"},
    }},
    # The token body as JSON (the spec's shape) and as an RFC 6749 form: separate schemas, so code
    # generators give each content type its own model (one shared schema broke generated clients).
    "TokenRequestJson": {"type": "object", "required": ["grant_type"], "properties": TOKEN_REQUEST_FIELDS,
                         "description": "JSON body; the client may authenticate in it or with HTTP Basic"},
    "TokenRequestForm": {"type": "object", "required": ["grant_type"], "properties": TOKEN_REQUEST_FIELDS,
                         "description": "RFC 6749 4.1.3 / 4.4.2 form body; each parameter at most once"},
    "TokenResponse": {"type": "object", "required": ["access_token", "token_type", "expires_in"], "properties": {
        "access_token": {"type": "string"}, "id_token": {"type": "string"},
        "token_type": {"type": "string",
                       "description": "`Bearer`; a backend app's system token (client assertion) says `bearer`, as "
                                      "SMART Backend Services shows it (RFC 6749 7.1: case-insensitive)"},
        "expires_in": {"type": "integer"},
        "scope": {"type": "string", "description": "the granted scope"},
        "patient": {"type": "string", "description": "SMART: the launch's patient (a FHIR Patient id), only when "
                                                     "the launch had a patient context"},
        "refresh_token": {"type": "string", "description": "SMART: when `offline_access` or `online_access` was "
                                                           "granted; a new one on every refresh (the old is spent)"},
    }, "additionalProperties": False},
    "UserInfo": {"type": "object", "required": ["sub"], "properties": {
        "sub": {"type": "string"}, "email": {"type": "string"}, "given_name": {"type": "string"},
        "family_name": {"type": "string"}}, "additionalProperties": True,
        "description": "Also `https://{claims_namespace}/ehrUsername` and `.../organization` when declared."},
    "Introspection": {"type": "object", "required": ["active"], "properties": {
        "active": {"type": "boolean"},
        "id_token": {"type": ["string", "null"], "description":
                     "Only for the platform (Bearer: the sandbox token of the token's user) and an active token: "
                     "the ID token issued with this access token, which the hub hands to the app's SDK."}},
        "additionalProperties": True},
    "SandboxLaunchRequest": _object({"client_id": {"type": "string"},
                                     "patient_id": {"type": "string", "pattern": ID_PATTERN,
                                                    "description": "optional: the launch's patient context"}},
                                    required=["client_id"], additional=True),
    "SandboxLaunch": _object({"launch_id": {"type": "string"}, "launch_url": {"type": "string", "format": "uri"},
                              "expires_in": {"type": "integer"}}),
    "InvitationRequest": _object({
        "email": {"type": "string", "format": "email", "maxLength": 200},
        "given_name": {"type": "string", "minLength": 1, "maxLength": 200},
        "family_name": {"type": "string", "minLength": 1, "maxLength": 200},
        "organization_name": {"type": "string", "minLength": 1, "maxLength": 200},
        "npi": {"type": "string", "pattern": NPI_PATTERN},
    }, required=["email", "given_name", "family_name", "organization_name"]),
    "Invitation": _object({"invitation_url": {"type": "string", "format": "uri"}, "expires_at": DATE_TIME,
                           "organization_id": {"type": "string"}, "user_id": {"type": "string"}}),
    "Organization": _object({
        "id": {"type": "string"}, "name": {"type": "string"}, "ehr": {"type": "string"},
        "installed_at": DATE_TIME,
        "activation_status": {"type": ["string", "null"], "enum": [*ACTIVATION_STATUSES, None],
                              "description": "null until the app's first SDK initialization in the organization"},
        "user_count": {"type": "integer", "minimum": 0}}),
    "User": _object({
        "id": {"type": "string"}, "email": {"type": "string"}, "given_name": NULLABLE_STRING,
        "family_name": NULLABLE_STRING, "npi": NULLABLE_STRING,
        "status": {"type": "string", "enum": ["invited", "active", "authorized"]},
        "authorized_at": NULLABLE_DATE_TIME, "last_launch_at": NULLABLE_DATE_TIME}),
    "ActivationStatusRequest": _object({"status": {"type": "string", "enum": list(ACTIVATION_STATUSES)}}),
    "ActivationStatus": _object({"status": {"type": "string", "enum": list(ACTIVATION_STATUSES)},
                                 "trial_started_at": NULLABLE_DATE_TIME}),
    "BillableUser": _object({"user_id": {"type": "string"}, "email": {"type": "string"},
                             "first_verified_at": {**DATE_TIME, "description": "first billable verification "
                                                                               "of the month"}}),
    "BillingOrganization": _object({
        "organization_id": {"type": "string"}, "organization_name": {"type": "string"},
        "billable_users": {"type": "integer", "minimum": 0},
        "users": {"type": "array", "items": _ref("BillableUser")}}),
    "Billing": _object({
        "application_id": {"type": "string"}, "month": {"type": "string", "pattern": MONTH.pattern},
        "total_billable_users": {"type": "integer", "minimum": 0},
        "organizations": {"type": "array", "items": _ref("BillingOrganization")}}),
    "Appointment": _object({
        "id": {"type": "string"}, "start": DATE_TIME, "end": DATE_TIME,
        "status": {"type": "string", "enum": list(APPOINTMENT_STATUSES),
                   "description": "a FHIR R4 AppointmentStatus code, whatever the clinic's EHR; listed: "
                                  + ", ".join(LISTED_STATUSES)},
        "appointment_type": {"type": "string"}, "reason": {"type": "string"}, "location": {"type": "string"},
        "provider": _object({"user_id": {"type": "string"}, "npi": {"type": "string"}, "name": {"type": "string"}}),
        "patient": _object({"id": {"type": "string"}, "first_name": {"type": "string"},
                            "last_name": {"type": "string"}, "date_of_birth": {"type": "string", "format": "date"},
                            "sex": {"type": "string"}})}),
    "AppointmentPage": _object({
        "appointments": {"type": "array", "items": _ref("Appointment"), "maxItems": MAX_LIMIT},
        "offset": {"type": "integer", "minimum": 0}, "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
        "total": {"type": "integer", "minimum": 0},
        "snapshot_date": {"type": ["string", "null"], "format": "date",
                          "description": "date of the nightly snapshot read; null before the first one"}}),
    "ChartRequestCreate": _object({"svc_organization_id": {"type": "string", "pattern": ID_PATTERN},
                                   "patient_id": {"type": "string", "pattern": ID_PATTERN}}),
    "ChartRequestAccepted": _object({"request_id": {"type": "string"},
                                     "status": {"type": "string", "enum": ["pending"]}}),
    "ChartRequest": _object({"request_id": {"type": "string"},
                             "status": {"type": "string", "enum": ["pending", "ready", "failed", "expired"]},
                             "created_at": DATE_TIME, "ready_at": NULLABLE_DATE_TIME, "error": NULLABLE_STRING}),
    "DownloadUrl": _object({"download_url": {"type": "string", "format": "uri"}, "expires_at": DATE_TIME}),
})

HEADERS = MappingProxyType({
    "RateLimit-Limit": {"description": "requests allowed per window for this client and operation",
                        "schema": {"type": "integer"}},
    "RateLimit-Remaining": {"description": "requests left in the current window", "schema": {"type": "integer"}},
    "RateLimit-Reset": {"description": "seconds until the window resets", "schema": {"type": "integer"}},
    "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}},
    "WWW-Authenticate": {"description": "RFC 6750 Bearer challenge", "schema": {"type": "string"}},
})
LIMIT_HEADERS = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")


def _header_refs(names, required: bool) -> dict:
    return {n: {**HEADERS[n], **({"required": True} if required else {})} for n in names}


def _json(schema: dict, description: str, headers: dict | None = None) -> dict:
    response = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


def _error(description: str, headers: dict | None = None) -> dict:
    return _json(_ref("Error"), description, headers)


def _path_param(name: str, description: str) -> dict:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string", "pattern": ID_PATTERN, "maxLength": 64}}


def _rest_operation(summary: str, operation_id: str, limited: bool, success: dict, errors: dict,
                    parameters: list | None = None, body: str | None = None) -> dict:
    """A partner API operation: Bearer auth, region rule, rate limit, JSON errors."""
    limit_headers = _header_refs(LIMIT_HEADERS, required=True) if limited else None
    responses = {}
    for status, response in success.items():
        response = copy.deepcopy(response)
        if limit_headers:
            response.setdefault("headers", {}).update(limit_headers)
        responses[status] = response
    responses.update(errors)
    responses["401"] = _error("missing, invalid, expired or revoked access token",
                              _header_refs(["WWW-Authenticate"], required=True))
    responses["403"] = _error("`region_not_allowed` (client network outside the allowlist) or not the caller's "
                              "application/organization (`forbidden`, `not_installed`), or, for a clinic's data "
                              "(appointments, charts), `application_disabled`: the application is Disabled there")
    responses["413"] = _error("request body too large")
    if limited:
        responses["429"] = _error("`rate_limited`: too many requests for this operation",
                                  _header_refs([*LIMIT_HEADERS, "Retry-After"], required=True))
        responses["503"] = _error("`rate_limiter_unavailable`: the shared rate-limit store cannot be reached",
                                  _header_refs(["Retry-After"], required=True))
    operation = {"summary": summary, "operationId": operation_id, "tags": ["partner"],
                 "security": [{"partnerToken": []}], "parameters": parameters or [], "responses": responses}
    if body:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(body)}}}
        responses.setdefault("400", _error("bad JSON, wrong types, unknown or missing fields"))
        responses["415"] = _error("Content-Type is not application/json")
    if limited:
        operation["x-rate-limit-operation"] = operation_id
    return operation


BAD_ID = MappingProxyType({"400": _error("a path identifier of the wrong shape")})
NOT_FOUND = MappingProxyType({"404": _error("unknown application, organization or request")})


def _rest_paths() -> dict:
    app_id = _path_param("applicationId", "the caller's own application id")
    org_id = _path_param("organizationId", "an organization where the application is installed")
    request_id = _path_param("requestId", "a chart retrieval request id (test mode: a1b2c3d4e5f6a7b8c9d0)")
    paging = [
        {"name": "offset", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0, "default": 0}},
        {"name": "limit", "in": "query", "required": False,
         "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": MAX_LIMIT}},
    ]
    return {
        "/v1/invitations": {"post": _rest_operation(
            "Invite a user: creates the user and organization, installs the app, returns a single-use link",
            "invitations", True, {"201": _json(_ref("Invitation"), "invitation created")},
            {"409": _error("`email_taken`: a user with this e-mail exists; nothing was created (the app's own "
                           "invitee whose every link expired unopened is invited again instead: 201, a new link "
                           "for the same user and organization)")},
            body="InvitationRequest")},
        "/v1/applications/{applicationId}/organizations": {"get": _rest_operation(
            "Organizations where the application is installed", "organizations", True,
            {"200": _json({"type": "array", "items": _ref("Organization")}, "the organizations")},
            {**BAD_ID, **NOT_FOUND}, [app_id])},
        "/v1/applications/{applicationId}/organizations/{organizationId}/users": {"get": _rest_operation(
            "Users of one organization and their status for this application", "users", True,
            {"200": _json({"type": "array", "items": _ref("User")}, "the users")},
            {**BAD_ID, **NOT_FOUND}, [app_id, org_id])},
        "/v1/applications/{applicationId}/organizations/{organizationId}/activation-status": {
            "put": _rest_operation(
                "Set the application's activation status in one organization (first Enabled starts the trial)",
                "activation_status", True, {"200": _json(_ref("ActivationStatus"), "the new status")},
                {**NOT_FOUND, "409": _error("`not_initialized`: no SDK initialization in this organization yet")},
                [app_id, org_id], body="ActivationStatusRequest")},
        "/v1/applications/{applicationId}/billing": {"get": _rest_operation(
            "Billable users of the application per organization for one UTC month (spec: billing rule)",
            "billing", True, {"200": _json(_ref("Billing"), "the month's ledger")},
            {"400": _error("`invalid_month` (month missing or not YYYY-MM) or a path identifier of the wrong "
                           "shape"), **NOT_FOUND},
            [app_id, {"name": "month", "in": "query", "required": True, "description": "UTC month, YYYY-MM",
                      "schema": {"type": "string", "pattern": MONTH.pattern}}])},
        "/v1/appointments/{svcOrganizationId}": {"get": _rest_operation(
            "Appointments of the coming 10 days of authorized providers (nightly snapshot; test org 123456789)",
            "appointments", True, {"200": _json(_ref("AppointmentPage"), "one page")},
            {"400": _error("`invalid_pagination` or a path identifier of the wrong shape"), **NOT_FOUND},
            [_path_param("svcOrganizationId", "organization id, or 123456789 for the test data set"), *paging])},
        "/v1/chart-retrieval/requests": {"post": _rest_operation(
            "Request a patient's chart; a worker builds the ZIP", "chart_request_create", True,
            {"202": _json(_ref("ChartRequestAccepted"), "accepted; poll its status")}, NOT_FOUND,
            body="ChartRequestCreate")},
        "/v1/chart-retrieval/requests/{requestId}": {"get": _rest_operation(
            "Status of a chart retrieval request", "chart_request_status", True,
            {"200": _json(_ref("ChartRequest"), "the request")}, {**BAD_ID, **NOT_FOUND}, [request_id])},
        "/v1/chart-retrieval/download-url/{requestId}": {"get": _rest_operation(
            "A 15-minute download URL of the chart ZIP (AES-256, password = the application id)",
            "chart_download_url", True,
            {"200": _json(_ref("DownloadUrl"), "the URL"),
             "202": _json(_ref("ChartRequest"), "still pending; retry after `Retry-After` seconds",
                          {"Retry-After": {**HEADERS["Retry-After"], "required": True}})},
            {**BAD_ID, **NOT_FOUND, "409": _error("`chart_failed`: the chart could not be built"),
             "410": _error("`chart_expired`: the archive was deleted `SVC_CHART_TTL` after it was built; "
                           "request the chart again")}, [request_id])},
    }


def _oauth_paths(prefix: str) -> dict:
    token_errors = {"400": _error("RFC 6749 5.2 error"),
                    "401": _error("`invalid_client`"),
                    "413": _error("request body too large"),
                    "415": _error("unsupported Content-Type"),
                    "429": _error("`too_many_attempts`: too many failed client authentications from this "
                                  "address or for this client; retry after `Retry-After` seconds",
                                  _header_refs(["Retry-After"], required=True)),
                    "503": _error("the failure counter's store (Redis) cannot be reached",
                                  _header_refs(["Retry-After"], required=True))}
    form_or_json = {"application/json": {"schema": _ref("TokenRequestJson")},
                    "application/x-www-form-urlencoded": {"schema": _ref("TokenRequestForm")}}
    # Unique operation ids: the /v1 names, prefixed for the /os-api/v2 copies.
    op_id = (lambda name: name) if prefix == "/v1" else (lambda name: "os_api_v2_" + name)
    bearer_401 = _error("bad or expired token", _header_refs(["WWW-Authenticate"], required=True))
    disabled_403 = _error("`application_disabled`: the application is Disabled in the user's organization "
                          "(or `not_installed`: no longer installed there)")
    userinfo = {"summary": "OIDC UserInfo", "operationId": op_id("oauth_userinfo"), "tags": ["oauth"],
                "security": [{"userToken": []}],
                "responses": {"200": _json(_ref("UserInfo"), "claims the app declared"), "401": bearer_401,
                              "403": disabled_403, "413": _error("request body too large")}}
    grants = ("`authorization_code`, `client_credentials` or `refresh_token`" if prefix == "/v1"
              else "`authorization_code` or `refresh_token`")
    html = {"text/html": {"schema": {"type": "string"}}, "application/json": {"schema": _ref("Error")}}
    authorize_names = ("client_id", "redirect_uri", "launch_id", "launch", "aud", "scope", "response_type", "state",
                       "login_hint", "nonce", "code_challenge", "code_challenge_method")
    untrusted_400 = {"description": "unknown client or untrusted redirect_uri (or, for POST, a parameter in "
                                    "both the query and the body, a repeated one, NUL or not UTF-8): shown, "
                                    "never redirected", "content": html}
    return {
        f"{prefix}/oauth/authorize": {"get": {
            "summary": "Authorization endpoint (code flow from a host-platform launch)",
            "operationId": op_id("oauth_authorize"), "tags": ["oauth"],
            "parameters": [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
                           for n in authorize_names],
            "responses": {"302": {"description": "redirect to redirect_uri with `code` (or `error`)"},
                          "400": untrusted_400}},
            "post": {
            "summary": "Authorization endpoint by POST (OIDC Core 3.1.2.1): the same parameters as a form body",
            "description": "The same request, checks and answers as GET, the parameters in an "
                           "`application/x-www-form-urlencoded` body (some may stay in the query; one "
                           "given in both is a 400). The redirect is a 303, so the browser GETs redirect_uri.",
            "operationId": op_id("oauth_authorize_post"), "tags": ["oauth"],
            "requestBody": {"required": False, "content": {"application/x-www-form-urlencoded": {"schema": {
                "type": "object", "properties": {n: {"type": "string"} for n in authorize_names}}}}},
            "responses": {"303": {"description": "redirect to redirect_uri with `code` (or `error`)"},
                          "400": copy.deepcopy(untrusted_400),
                          "413": _error("request body too large"),
                          "415": _error("the body is not `application/x-www-form-urlencoded`")}}},
        f"{prefix}/oauth/token": {"post": {
            "summary": f"Token endpoint: {grants}; client auth by body or HTTP Basic",
            "operationId": op_id("oauth_token"), "tags": ["oauth"],
            "security": [{}, {"clientBasic": []}],
            # Not `required`: openapi-python-client (0.29) always types a body with several content
            # types as optional and imports `Unset` only for optional bodies, so a required one made
            # the generated module fail to import. A missing body is a 400 `invalid_request`.
            "requestBody": {"required": False, "content": form_or_json},
            "responses": {"200": _json(_ref("TokenResponse"), "tokens"), "403": disabled_403, **token_errors}}},
        f"{prefix}/oauth/userinfo": {"get": userinfo,
                                     "post": {**copy.deepcopy(userinfo), "operationId": op_id("oauth_userinfo_post")}},
        f"{prefix}/oauth/introspect": {"post": {
            "summary": "Token introspection (RFC 7662)", "operationId": op_id("oauth_introspect"), "tags": ["oauth"],
            "security": [{"clientBasic": []}, {"sandboxToken": []}],
            "requestBody": {"required": True, "content": {
                "application/x-www-form-urlencoded": {"schema": {"type": "object", "properties": {
                    "token": {"type": "string"}}, "required": ["token"]}}}},
            "responses": {"200": _json(_ref("Introspection"), "introspection result"),
                          **token_errors}}},
        f"{prefix}/oauth/revoke": {"post": {
            "summary": "Token revocation (RFC 7009): a client revokes its own access token, or its SMART refresh "
                       "token (which ends the grant)",
            "operationId": op_id("oauth_revoke"), "tags": ["oauth"],
            "security": [{}, {"clientBasic": []}],
            "requestBody": {"required": True, "content": {
                "application/x-www-form-urlencoded": {"schema": {"type": "object", "properties": {
                    "token": {"type": "string"}, "token_type_hint": {"type": "string"}}, "required": ["token"]}}}},
            "responses": {"200": {"description": "revoked, or the token was invalid or not the caller's "
                                                 "(RFC 7009 2.2: the same answer)"},
                          **token_errors}}},
    }


@functools.lru_cache(maxsize=8)
def _document(public_url: str) -> dict:
    paths = {**_oauth_paths("/v1"), **_oauth_paths("/os-api/v2"), **_rest_paths()}
    paths["/v1/sandbox/launches"] = {"post": {
        "summary": "Testing operation: create a launch with a sandbox settings token",
        "operationId": "sandbox_launch_create", "tags": ["sandbox"],
        "security": [{"sandboxToken": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("SandboxLaunchRequest")}}},
        "responses": {"201": _json(_ref("SandboxLaunch"), "launch created"),
                      "400": _error("bad request"), "401": _error("`invalid_token`: Authentication failed"),
                      "403": _error("the app is not installed or cannot be opened"),
                      "404": _error("unknown client"), "413": _error("request body too large"),
                      "415": _error("unsupported Content-Type")}}}
    paths["/invitations/{token}"] = {"get": {
        "summary": "Invitation link: single use, expiring; activates the user and signs them in to their "
                   "sandbox hub (with SVC_SANDBOX=on)",
        "operationId": "invitation_accept", "tags": ["partner"],
        "parameters": [{"name": "token", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {"302": {"description": "to /sandbox/hub, with a sandbox session cookie"},
                      "200": _json({"type": "object"}, "accepted (the sandbox is off: no hub to open)"),
                      "404": _error("`invitation_not_found`"),
                      "410": _error("`invitation_used` or `invitation_expired`")}}}
    paths["/v1/openapi.json"] = {"get": {"summary": "This document", "operationId": "openapi_document",
                                         "tags": ["meta"],
                                         "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")}}}
    paths["/v1/schemas/chart.json"] = {"get": {
        "summary": "The JSON Schema (draft 2020-12) of a chart ZIP's JSON: one shape for every EHR",
        "operationId": "chart_schema", "tags": ["meta"],
        "responses": {"200": {"description": "the schema (cacheable for a day)",
                              "content": {"application/schema+json": {"schema": {"type": "object"}}}}}}}
    paths["/v1/docs"] = {"get": {"summary": "This document as browsable documentation (Swagger UI, local assets)",
                                 "operationId": "api_docs", "tags": ["meta"],
                                 "responses": {"200": {"description": "an HTML page",
                                                       "content": {"text/html": {"schema": {"type": "string"}}}}}}}
    return _plain({
        "openapi": "3.1.0",
        "info": {"title": "svc-auth partner REST API and authorization server", "version": VERSION,
                 "description": "Partner REST API (`/v1`, OAuth 2.0 client credentials) and the OAuth 2.0 / "
                                "OpenID Connect endpoints (`/v1` and `/os-api/v2`). Errors are "
                                "`{\"error\", \"message\"}`. See docs/rest-api.md."},
        "servers": [{"url": public_url}],
        "tags": [{"name": "partner"}, {"name": "oauth"}, {"name": "sandbox"}, {"name": "meta"}],
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "headers": HEADERS,
            "securitySchemes": {
                "partnerToken": {"type": "oauth2", "flows": {"clientCredentials": {
                                     "tokenUrl": f"{public_url}/v1/oauth/token", "scopes": {}}},
                                 "description": "OAuth 2.0 client credentials: the access token from the token "
                                                "operation (`grant_type=client_credentials`), sent as "
                                                "`Authorization: Bearer <token>`"},
                "userToken": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
                "sandboxToken": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
                "clientBasic": {"type": "http", "scheme": "basic"},
            },
        },
    })


def openapi_document(public_url: str) -> dict:
    """The document with `servers` set to this deployment's public URL (a fresh copy)."""
    return copy.deepcopy(_document(public_url))
