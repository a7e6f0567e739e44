/**
 * The package entry for bundlers and Node (ESM and, through the build, CommonJS):
 *   import { loadSdk } from "@svc-auth/sdk";
 * Binds the SDK to `window` (globalThis outside a browser, where only the exports are useful).
 * In a module `document.currentScript` is unset, so the platform origin comes from
 * `options.platformOrigin` or the embedding page's ancestor origin.
 */
import { createSdk } from "./core.js";

const sdk = createSdk(typeof window !== "undefined" ? window : globalThis);

export const initializeSvcSDK = sdk.initializeSvcSDK;
export const loadSdk = sdk.loadSdk;
export const SvcSdkError = sdk.SvcSdkError;
export { createSdk };
export default sdk;
