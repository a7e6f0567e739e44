// Unit tests of the SDK's logic (src/core.js) through createSdk(window): a real HTTP server plays
// the app token endpoint, a fake hub window answers over postMessage.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, test } from "node:test";

import { createSdk } from "../src/core.js";
import { framedApp, FakeWindow } from "./fake-window.mjs";

const HUB = "http://hub.example";
let server;
let tokenUrl;
const seen = [];

before(async () => {
  server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (chunk) => { body += chunk; });
    req.on("end", () => {
      const { code } = JSON.parse(body || "{}");
      seen.push({ path: req.url, contentType: req.headers["content-type"], code });
      const answers = {
        good: [200, { access_token: "at-1", id_token: "idt-1", token_type: "Bearer", expires_in: 300 }],
        no_id_token: [200, { access_token: "at-2", token_type: "Bearer", expires_in: 300 }],
        refused: [403, { error: "forbidden", message: "not one of our users" }],
        expired: [403, { error: "trial_expired", message: "The free trial has ended." }],
      };
      const [status, payload] = answers[code] || [400, { error: "invalid_grant", message: "bad code" }];
      res.writeHead(status, { "Content-Type": "application/json" });
      res.end(JSON.stringify(payload));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  tokenUrl = `http://127.0.0.1:${server.address().port}/api/token`;
});

after(() => server.close());

function hubThatVerifies(verdict = { type: "verified" }) {
  const requests = [];
  const answer = (message) => {
    requests.push(message);
    if (message.type === "context") return { type: "context", tokenEndpoint: tokenUrl };
    if (message.type === "verify") return verdict;
    return null;
  };
  return { requests, answer };
}

test("a launch: code exchanged at the token endpoint, the hub verifies, getIdToken resolves", async () => {
  const hub = hubThatVerifies();
  const { app } = framedApp("http://app.example/app?code=good&state=s", HUB, hub.answer);
  const instance = await createSdk(app).loadSdk({ platformOrigin: HUB, timeoutMs: 2000 });
  assert.equal(instance.platformOrigin, HUB);
  assert.equal((await instance.sessionContext.getIdToken()).idToken, "idt-1");
  assert.deepEqual(hub.requests.map((m) => m.type), ["context", "verify"]);
  assert.equal(hub.requests[1].accessToken, "at-1");
  assert.deepEqual(seen.at(-1), { path: "/api/token", contentType: "application/json", code: "good" });
  // The code is single-use: it left the URL, the rest stayed.
  assert.equal(app.location.href, "http://app.example/app?state=s");
});

test("a backend that returns no id_token: the initialization rejects with SvcSdkError no_id_token", async () => {
  const hub = hubThatVerifies();
  const { app } = framedApp("http://app.example/app?code=no_id_token", HUB, hub.answer);
  await assert.rejects(createSdk(app).loadSdk({ platformOrigin: HUB, tokenEndpoint: tokenUrl, timeoutMs: 2000 }),
    (error) => error.name === "SvcSdkError" && error.code === "no_id_token" && /returned no id_token/.test(error.message));
});

test("an access token given without an ID token, and none issued with it: rejects with no_id_token", async () => {
  const hub = hubThatVerifies({ type: "verified" });
  const { app } = framedApp("http://app.example/app", HUB, hub.answer);
  await assert.rejects(createSdk(app).loadSdk({ platformOrigin: HUB, accessToken: "at-z", timeoutMs: 2000 }),
    (error) => error.name === "SvcSdkError" && error.code === "no_id_token");
});

test("tokenEndpoint in the options skips the context request", async () => {
  const hub = hubThatVerifies();
  const { app } = framedApp("http://app.example/app?code=good", HUB, hub.answer);
  await createSdk(app).initializeSvcSDK({ platformOrigin: HUB, tokenEndpoint: tokenUrl, timeoutMs: 2000 });
  assert.deepEqual(hub.requests.map((m) => m.type), ["verify"]);
});

test("a bundled SDK without platformOrigin never takes the framing page for the platform", async () => {
  // Any page can frame the app: taking `location.ancestorOrigins[0]` for the platform handed it the
  // access token, and trusted its answers for the FHIR base and the token endpoint.
  const hub = hubThatVerifies();
  const { app, hub: framer } = framedApp("http://app.example/app?code=good", HUB, hub.answer);
  await assert.rejects(createSdk(app).loadSdk({ accessToken: "victim-token", timeoutMs: 2000 }),
    { code: "platform_unknown" });
  await assert.rejects(createSdk(app).loadSdk({ tokenEndpoint: tokenUrl, timeoutMs: 2000 }),
    { code: "platform_unknown" });
  assert.deepEqual(framer.posted, []);
});

for (const [code, expected, status] of [["refused", "forbidden", 403], ["expired", "trial_expired", 403],
  ["nonsense", "invalid_grant", 400]]) {
  test(`token endpoint answer ${code} rejects with ${expected} and tells the hub`, async () => {
    const hub = hubThatVerifies();
    const { app, hub: hubWindow } = framedApp(`http://app.example/app?code=${code}`, HUB, hub.answer);
    await assert.rejects(createSdk(app).loadSdk({ platformOrigin: HUB, tokenEndpoint: tokenUrl, timeoutMs: 2000 }),
      (error) => error.name === "SvcSdkError" && error.code === expected && error.status === status);
    const notice = hubWindow.posted.at(-1);
    assert.equal(notice.data.type, "error");
    assert.equal(notice.data.error, expected);
    assert.equal(notice.targetOrigin, HUB);
  });
}

test("the platform refusing the token rejects with its error", async () => {
  const hub = hubThatVerifies({ type: "rejected", error: "application_disabled", message: "disabled" });
  const { app } = framedApp("http://app.example/app?code=good", HUB, hub.answer);
  await assert.rejects(createSdk(app).loadSdk({ platformOrigin: HUB, tokenEndpoint: tokenUrl, timeoutMs: 2000 }),
    { code: "application_disabled" });
});

test("an authorize error in the URL rejects without calling the token endpoint", async () => {
  const hub = hubThatVerifies();
  const before = seen.length;
  const { app } = framedApp("http://app.example/app?error=access_denied&error_description=no", HUB, hub.answer);
  await assert.rejects(createSdk(app).loadSdk({ platformOrigin: HUB, tokenEndpoint: tokenUrl, timeoutMs: 2000 }),
    { code: "access_denied", message: "Authorization failed: access_denied (no)" });
  assert.equal(seen.length, before);
});

test("no code in the URL: missing_code", async () => {
  const { app } = framedApp("http://app.example/app", HUB, hubThatVerifies().answer);
  await assert.rejects(createSdk(app).loadSdk({ platformOrigin: HUB, tokenEndpoint: tokenUrl }), { code: "missing_code" });
});

test("accessToken in the options (identity-provider variant) goes straight to verification", async () => {
  const hub = hubThatVerifies();
  const { app } = framedApp("http://app.example/app", HUB, hub.answer);
  const instance = await createSdk(app).loadSdk({ platformOrigin: HUB, accessToken: "at-x", idToken: "idt-x",
    timeoutMs: 2000 });
  assert.deepEqual(hub.requests.map((m) => [m.type, m.accessToken]), [["verify", "at-x"]]);
  assert.equal((await instance.sessionContext.getIdToken()).idToken, "idt-x");
});

test("identity-provider variant without an ID token: getIdToken resolves the one the platform returns", async () => {
  const hub = hubThatVerifies({ type: "verified", idToken: "idt-issued-with-at-y" });
  const { app } = framedApp("http://app.example/app", HUB, hub.answer);
  const instance = await createSdk(app).loadSdk({ platformOrigin: HUB, accessToken: "at-y", timeoutMs: 2000 });
  assert.equal((await instance.sessionContext.getIdToken()).idToken, "idt-issued-with-at-y");
});

test("a page that is not framed rejects with not_embedded", async () => {
  const alone = new FakeWindow("http://app.example/app?code=good");
  await assert.rejects(createSdk(alone).loadSdk({ platformOrigin: HUB }), { code: "not_embedded" });
});

test("answers from another origin are ignored: the SDK times out", async () => {
  const hub = hubThatVerifies();
  const { app, hub: hubWindow } = framedApp("http://app.example/app?code=good", HUB, () => null);
  hubWindow.postMessage = (data) => {
    const evil = new FakeWindow("http://evil.example/");
    setTimeout(() => app.deliver({ channel: "svc-platform", id: data.id, type: "verified" }, evil), 0);
  };
  await assert.rejects(createSdk(app).loadSdk({ platformOrigin: HUB, tokenEndpoint: tokenUrl, timeoutMs: 200 }),
    { code: "platform_timeout" });
  assert.equal(hub.requests.length, 0);
});
