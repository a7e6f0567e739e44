// instance.fhir: read and search send the instance's access token to the clinic's FHIR base and
// resolve the JSON; an OperationOutcome rejects as an SvcSdkError. A real HTTP server plays the API.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, test } from "node:test";

import { createSdk } from "../src/core.js";
import { framedApp } from "./fake-window.mjs";

const HUB = "http://hub.example";
let server;
let origin;
const requests = [];

function jwtWith(claims) {
  const part = (value) => Buffer.from(JSON.stringify(value)).toString("base64url");
  return `${part({ alg: "RS256", typ: "at+jwt" })}.${part(claims)}.sig`;
}

before(async () => {
  server = http.createServer((req, res) => {
    requests.push({ url: req.url, authorization: req.headers.authorization, accept: req.headers.accept });
    const [path] = req.url.split("?");
    let status = 200;
    let body;
    if (path.endsWith("/Patient/pat-1")) body = { resourceType: "Patient", id: "pat-1" };
    else if (path.endsWith("/Condition")) body = { resourceType: "Bundle", type: "searchset", total: 0, entry: [] };
    else {
      status = path.endsWith("/Appointment") ? 403 : 404;
      body = { resourceType: "OperationOutcome", issue: [{ severity: "error",
        code: status === 403 ? "forbidden" : "not-found", diagnostics: "nope" }] };
    }
    res.writeHead(status, { "Content-Type": "application/fhir+json" });
    res.end(JSON.stringify(body));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  origin = `http://127.0.0.1:${server.address().port}`;
});

after(() => server.close());

async function instance(options, accessToken) {
  const answer = (message) => (message.type === "verify" ? { type: "verified" } : null);
  const { app } = framedApp("http://app.example/app", HUB, answer);
  return createSdk(app).loadSdk({ platformOrigin: HUB, accessToken, idToken: "idt", timeoutMs: 2000, ...options });
}

test("read and search send the access token to the FHIR base and resolve the JSON", async () => {
  const token = jwtWith({ org: "org_a" });
  const sdk = await instance({ iss: `${origin}/fhir/r4/org_a/` }, token);
  assert.equal(sdk.fhir.baseUrl, `${origin}/fhir/r4/org_a`);
  assert.deepEqual(await sdk.fhir.read("Patient", "pat-1"), { resourceType: "Patient", id: "pat-1" });
  assert.deepEqual(requests.at(-1), { url: "/fhir/r4/org_a/Patient/pat-1", authorization: `Bearer ${token}`,
    accept: "application/fhir+json" });
  const bundle = await sdk.fhir.search("Condition", { patient: "pat 1", date: ["ge2026-01-01", "lt2026-02-01"], _count: 5 });
  assert.equal(bundle.type, "searchset");
  assert.equal(requests.at(-1).url,
    "/fhir/r4/org_a/Condition?patient=pat+1&date=ge2026-01-01&date=lt2026-02-01&_count=5");
});

test("an OperationOutcome rejects with an SvcSdkError carrying it", async () => {
  const sdk = await instance({ fhirBaseUrl: `${origin}/fhir/r4/org_a` }, jwtWith({ org: "org_a" }));
  await assert.rejects(sdk.fhir.search("Appointment", { patient: "pat-1" }), (error) =>
    error.name === "SvcSdkError" && error.code === "forbidden" && error.status === 403 &&
    error.body.resourceType === "OperationOutcome" && /403: nope/.test(error.message));
  await assert.rejects(sdk.fhir.read("Patient", "../x"), { code: "not-found", status: 404 });
  assert.equal(requests.at(-1).url, "/fhir/r4/org_a/Patient/..%2Fx");  // the id is one path segment
  await assert.rejects(sdk.fhir.read("not a type", "x"), { code: "invalid_resource_type" });
});

test("without an iss the base is the platform's, for the access token's clinic", async () => {
  const sdk = await instance({}, jwtWith({ org: "org_b", sub: "usr_1" }));
  assert.equal(sdk.fhir.baseUrl, `${HUB}/fhir/r4/org_b`);
  const opaque = await instance({}, "not-a-jwt");
  assert.equal(opaque.fhir.baseUrl, null);
  await assert.rejects(opaque.fhir.read("Patient", "pat-1"), { code: "no_fhir_base" });
});
