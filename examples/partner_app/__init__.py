"""The example partner app: the two endpoints the spec asks every app to implement, done for real.

- `GET /launch`: the host platform opens the app here; it redirects to `{base_url}/oauth/authorize`.
- `POST /api/token`: the SDK posts the one-time `code`; the backend exchanges it (retrying once with
  the fallback secret during a rotation), verifies the ID token against the JWKS, checks the user in
  its own records and answers the token response, 403, or 403 `trial_expired`.
- `POST /api/session`: the optional SSO step, ID token (Bearer) in, the app's own session out.
- `GET /app`: the main page; it loads the SDK from the service and shows the ID token claims.

It depends on nothing of svc-auth (only Tornado and python-jose), so a partner can copy it as is.
Run it alone with `python -m examples.partner_app` (see `docs/hub-and-sdk.md`); `svc-auth serve
--demo` starts it in-process next to the service.
"""
