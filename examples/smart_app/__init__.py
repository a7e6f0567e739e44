"""The example SMART app: a browser-only public client written with SMART Health IT's `fhirclient`.

No backend of its own and no secret: `static/launch.html` is its launch URL (the EHR opens it with
`iss` and `launch`); `FHIR.oauth2.authorize` reads `{iss}/.well-known/smart-configuration`, sends
the user to the authorize endpoint with `aud`, `scope`, `launch` and a PKCE S256 challenge;
`static/index.html` (the redirect URI) runs `FHIR.oauth2.ready()`, which exchanges the code with
`client_id` and the PKCE verifier, then reads the launch's patient from the clinic's FHIR API.
The signed-in user (the ID token's `fhirUser`) must be on the app's own list, else it shows
`#smart-refused` and reads nothing.

`fhirclient`'s browser build is vendored under `static/fhirclient/` (`make vendor-fhirclient`, the
version pinned in `package.json`). The server here only serves those files and `config.json` (the
client id, scope and authorized users); `svc-auth serve --demo` mounts it under `/smart/` on the
example partner app's port. See docs/smart.md.
"""
