// The built package: what the ESM, CommonJS and script-tag builds export, that dist/ is exactly
// what `node build.mjs` makes from src/ today, that `npm install` of the packed tarball works in a
// partner's project, and that the TypeScript declarations type-check there.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import vm from "node:vm";
import { after, before, test } from "node:test";

import { FakeWindow } from "./fake-window.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const dist = path.join(root, "dist");
const require = createRequire(import.meta.url);
const EXPORTS = ["SvcSdkError", "createSdk", "default", "initializeSvcSDK", "loadSdk"];

test("the ES module build exports loadSdk, initializeSvcSDK, SvcSdkError, createSdk and a default", async () => {
  const sdk = await import("@svc-auth/sdk");
  assert.deepEqual(Object.keys(sdk).sort(), EXPORTS);
  assert.equal(sdk.loadSdk, sdk.initializeSvcSDK);
  assert.equal(sdk.default.loadSdk, sdk.loadSdk);
  const error = sdk.SvcSdkError("forbidden", "403 Forbidden", 403);
  assert.ok(error instanceof Error);
  assert.deepEqual([error.name, error.code, error.status], ["SvcSdkError", "forbidden", 403]);
});

test("the CommonJS build exports the same", () => {
  const sdk = require("@svc-auth/sdk");
  assert.equal(require.resolve("@svc-auth/sdk"), path.join(dist, "svc-sdk.cjs"));
  assert.deepEqual(Object.keys(sdk).filter((k) => k !== "__esModule").sort(), EXPORTS);
  assert.equal(typeof sdk.loadSdk, "function");
});

test("the script-tag build sets window.svcSdk and window.loadSdk; the platform origin is the script's", async () => {
  const hubOrigin = "http://127.0.0.1:8888";
  const hub = new FakeWindow(hubOrigin + "/sandbox/hub");
  const app = new FakeWindow("http://127.0.0.1:8889/app", { parent: hub });
  app.document.currentScript = { src: hubOrigin + "/static/sdk/svc-sdk.js" };
  hub.postMessage = (data) => setTimeout(() => app.deliver({ channel: "svc-platform", id: data.id, type: "verified" },
    hub), 0);
  app.window = app;
  const context = vm.createContext(Object.assign(app, { URL, setTimeout, clearTimeout, Promise }));
  vm.runInContext(readFileSync(path.join(dist, "svc-sdk.js"), "utf8"), context);
  assert.deepEqual(Object.keys(app.svcSdk).sort(), ["SvcSdkError", "initializeSvcSDK", "loadSdk"]);
  assert.equal(app.loadSdk, app.svcSdk.loadSdk);
  const instance = await app.svcSdk.loadSdk({ accessToken: "at", idToken: "idt", timeoutMs: 2000 });
  assert.equal(instance.platformOrigin, hubOrigin);
});

test("dist/ is the build of src/ (run `npm run build` in sdk/js after changing src/)", () => {
  const out = mkdtempSync(path.join(os.tmpdir(), "svc-sdk-build-"));
  try {
    execFileSync(process.execPath, [path.join(root, "build.mjs"), out], { stdio: "inherit" });
    const built = readdirSync(out).sort();
    assert.deepEqual(readdirSync(dist).sort(), built);
    for (const name of built) {
      assert.equal(readFileSync(path.join(dist, name), "utf8"), readFileSync(path.join(out, name), "utf8"),
        `dist/${name} differs from a fresh build: run \`npm run build\` in sdk/js and commit dist/`);
    }
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});

// A partner's project that ran `npm install <packed tarball>` (what docs/hub-and-sdk.md shows).
let consumer;
before(() => {
  consumer = mkdtempSync(path.join(os.tmpdir(), "svc-sdk-consumer-"));
  writeFileSync(path.join(consumer, "package.json"), JSON.stringify({ name: "partner-app", private: true }));
  const npm = (...args) => execFileSync("npm", [...args, "--silent", "--no-audit", "--no-fund"],
    { cwd: consumer, encoding: "utf8" });
  const tarball = npm("pack", root, "--pack-destination", consumer).trim().split("\n").at(-1);
  npm("install", "--offline", path.join(consumer, tarball));
});
after(() => rmSync(consumer, { recursive: true, force: true }));

test("npm install of the packed package: ESM import and CommonJS require work in a partner's project", () => {
  const run = (code, ext) => {
    const file = path.join(consumer, `check.${ext}`);
    writeFileSync(file, code);
    return execFileSync(process.execPath, [file], { cwd: consumer, encoding: "utf8" }).trim();
  };
  assert.equal(run(`import { loadSdk, SvcSdkError } from "@svc-auth/sdk";
    console.log(typeof loadSdk, SvcSdkError("x", "y").name);`, "mjs"), "function SvcSdkError");
  assert.equal(run(`const { loadSdk } = require("@svc-auth/sdk");
    console.log(typeof loadSdk, require.resolve("@svc-auth/sdk/svc-sdk.js").endsWith("dist/svc-sdk.js"));`, "cjs"),
  "function true");
});

test("the TypeScript declarations type-check for ESM, CommonJS and script-tag users", () => {
  const work = consumer;
  writeFileSync(path.join(work, "esm.mts"), `
    import sdk, { loadSdk, initializeSvcSDK, SvcSdkError, type SvcPlatformInstance } from "@svc-auth/sdk";
    const instance: Promise<SvcPlatformInstance> = loadSdk({ tokenEndpoint: "/api/token", timeoutMs: 1 });
    instance.then(async (i) => { const t: string = (await i.sessionContext.getIdToken()).idToken; t.toUpperCase(); });
    initializeSvcSDK({ accessToken: "a", idToken: null, platformOrigin: "https://hub" });
    const e: SvcSdkError = SvcSdkError("forbidden", "no", 403);
    const code: string = e.code;
    sdk.loadSdk();
  `);
  writeFileSync(path.join(work, "cjs.cts"), `
    import sdk = require("@svc-auth/sdk");
    sdk.loadSdk({ tokenEndpoint: "/api/token" }).then((i) => i.platformOrigin.toUpperCase());
  `);
  writeFileSync(path.join(work, "script.ts"), `
    /// <reference types="@svc-auth/sdk" />
    window.svcSdk.initializeSvcSDK({}).then((i) => i.sessionContext.getIdToken());
    window.loadSdk();
  `);
  writeFileSync(path.join(work, "bad.mts"), `
    import { loadSdk } from "@svc-auth/sdk";
    loadSdk({ tokenEndpoint: 42 });
  `);
  const tsc = path.join(root, "node_modules", "typescript", "bin", "tsc");
  const flags = ["--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext",
    "--target", "es2020", "--lib", "es2020,dom"];
  const run = (...files) => execFileSync(process.execPath, [tsc, ...flags, ...files.map((f) => path.join(work, f))],
    { cwd: work, encoding: "utf8" });
  try {
    run("esm.mts", "cjs.cts", "script.ts");
  } catch (error) {
    assert.fail(error.stdout);
  }
  assert.throws(() => run("bad.mts"), (error) => /TS2322/.test(error.stdout));
});
