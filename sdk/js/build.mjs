// Builds dist/ from src/ with esbuild (pinned in package-lock.json), byte-for-byte reproducibly:
//   dist/svc-sdk.js   script tag (IIFE): window.svcSdk, window.loadSdk; the file the service serves
//   dist/svc-sdk.mjs  ES module         dist/svc-sdk.cjs  CommonJS
//   dist/svc-sdk.d.ts, .d.mts, .d.cts   TypeScript declarations (copied from src/svc-sdk.d.ts)
// `node build.mjs [OUTDIR]` (default dist/); the tests build into a temp dir and compare.
import { copyFile, mkdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = path.dirname(fileURLToPath(import.meta.url));
const outdir = path.resolve(process.argv[2] || path.join(here, "dist"));
// absWorkingDir: the "// src/core.js" markers in the output do not depend on where the build is run from.
const common = { bundle: true, target: "es2018", legalComments: "inline", charset: "utf8", logLevel: "warning",
  absWorkingDir: here };

await mkdir(outdir, { recursive: true });
await esbuild.build({ ...common, entryPoints: [path.join(here, "src/browser.js")], format: "iife",
  platform: "browser", outfile: path.join(outdir, "svc-sdk.js") });
await esbuild.build({ ...common, entryPoints: [path.join(here, "src/index.js")], format: "esm",
  platform: "neutral", outfile: path.join(outdir, "svc-sdk.mjs") });
await esbuild.build({ ...common, entryPoints: [path.join(here, "src/index.js")], format: "cjs",
  platform: "node", outfile: path.join(outdir, "svc-sdk.cjs") });
for (const name of ["svc-sdk.d.ts", "svc-sdk.d.mts", "svc-sdk.d.cts"]) {
  await copyFile(path.join(here, "src/svc-sdk.d.ts"), path.join(outdir, name));
}
