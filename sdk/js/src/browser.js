/**
 * The script-tag entry (built to dist/svc-sdk.js, served at /static/sdk/svc-sdk.js):
 * runs while the <script> executes, so `document.currentScript` gives the platform origin,
 * and publishes `window.svcSdk` and `window.loadSdk`.
 */
import { createSdk } from "./core.js";

const sdk = createSdk(window);
window.svcSdk = sdk;
window.loadSdk = sdk.loadSdk;
