// A relying party built on `openid-client` (npm), driven step by step by tests/test_oidc_clients.py.
// usage: node oidc_rp.mjs '<json>' where json is
//   {"op": "discover" | "authorize_url" | "callback", "issuer", "client_id", "client_secret",
//    "algorithm": "oidc" | "oauth2", "params": {...}, "callback_url", "checks": {...}, "userinfo": bool}
// Prints one JSON object. An authorization error response is printed as {"error", ...} (exit 0);
// anything the library refuses (a missing `iss`, a bad auth_time...) as {"refused", ...} (exit 0).
import * as client from "openid-client";

const input = JSON.parse(process.argv[2]);
const config = await client.discovery(
  new URL(input.issuer), input.client_id, input.client_secret,
  client.ClientSecretBasic(input.client_secret),
  { execute: [client.allowInsecureRequests], algorithm: input.algorithm || "oidc" });
const meta = config.serverMetadata();

if (input.op === "discover") {
  console.log(JSON.stringify(meta));
} else if (input.op === "authorize_url") {
  console.log(JSON.stringify({ url: client.buildAuthorizationUrl(config, input.params).href }));
} else if (input.op === "callback") {
  try {
    const tokens = await client.authorizationCodeGrant(config, new URL(input.callback_url), input.checks || {});
    const claims = tokens.claims();
    const out = { claims, scope: tokens.scope, token_type: tokens.token_type };
    if (input.userinfo) out.userinfo = await client.fetchUserInfo(config, tokens.access_token, claims.sub);
    console.log(JSON.stringify(out));
  } catch (err) {
    if (err instanceof client.AuthorizationResponseError) {
      console.log(JSON.stringify({ error: err.error, error_description: err.error_description }));
    } else {
      console.log(JSON.stringify({ refused: err.code || err.name, message: err.message }));
    }
  }
} else {
  throw new Error(`unknown op ${input.op}`);
}
