// The SDK's published ES module build (sdk/js/dist/svc-sdk.mjs) calling a real FHIR API:
//   node sdk_fhir.mjs '{"platform": "http://127.0.0.1:PORT", "accessToken": "...", "calls": [...]}'
// A minimal hub window above the app frame verifies the token (as the sandbox hub does); each call
// is ["read", type, id] or ["search", type, params]; prints [{ok, value} | {ok: false, code, status, body}].
import { createSdk } from "../../sdk/js/dist/svc-sdk.mjs";

const input = JSON.parse(process.argv[2]);
const hubOrigin = new URL(input.platform).origin;

class Frame extends EventTarget {
  constructor(href, parent) {
    super();
    this.location = new URL(href);
    this.location.ancestorOrigins = parent ? [hubOrigin] : [];
    this.parent = parent || this;
    this.document = { currentScript: null };
    this.history = { state: null, replaceState() {} };
  }
}

const hub = new Frame(`${hubOrigin}/sandbox/hub`, null);
const app = new Frame("https://app.example/main", hub);
hub.postMessage = (data, targetOrigin) => {
  if (targetOrigin !== hubOrigin || data.type !== "verify") return;
  const event = new Event("message");
  Object.assign(event, { data: { channel: "svc-platform", id: data.id, type: "verified" }, origin: hubOrigin, source: hub });
  setTimeout(() => app.dispatchEvent(event), 0);
};

// A bundled SDK names its platform (it never takes the framing page for it).
const instance = await createSdk(app).loadSdk({ accessToken: input.accessToken, idToken: "unused",
  platformOrigin: hubOrigin, timeoutMs: 5000 });
const results = [];
for (const [method, type, arg] of input.calls) {
  try {
    results.push({ ok: true, value: await instance.fhir[method](type, arg) });
  } catch (error) {
    results.push({ ok: false, code: error.code, status: error.status, body: error.body });
  }
}
console.log(JSON.stringify({ baseUrl: instance.fhir.baseUrl, results }));
