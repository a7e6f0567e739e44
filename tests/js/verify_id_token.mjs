// Verify an ID token with the `jose` npm package using only the published JWKS.
// usage: node verify_id_token.mjs JWKS_URL TOKEN ISSUER AUDIENCE  -> prints the payload as JSON
import { createRemoteJWKSet, jwtVerify } from "jose";

const [jwksUrl, token, issuer, audience] = process.argv.slice(2);
const jwks = createRemoteJWKSet(new URL(jwksUrl));
try {
  const { payload } = await jwtVerify(token, jwks, { issuer, audience, algorithms: ["RS256"] });
  console.log(JSON.stringify(payload));
} catch (err) {
  console.error(`${err.code || "ERR"}: ${err.message}`);
  process.exit(1);
}
