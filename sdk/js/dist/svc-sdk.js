(() => {
  // src/fhir.js
  var RESOURCE_TYPE = /^[A-Z][A-Za-z]{1,63}$/;
  function organizationOf(accessToken, global) {
    try {
      var payload = String(accessToken).split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      var decode = global && global.atob || atob;
      var claims = JSON.parse(decode(payload + "===".slice((payload.length + 3) % 4)));
      return typeof claims.org === "string" ? claims.org : null;
    } catch (e) {
      return null;
    }
  }
  function fhirBaseFor(options, platformOrigin, accessToken, global) {
    var explicit = options.fhirBaseUrl || options.iss;
    if (explicit) return String(explicit).replace(/\/+$/, "");
    var org = options.svcOrganizationId || organizationOf(accessToken, global);
    return org ? platformOrigin + "/fhir/r4/" + encodeURIComponent(org) : null;
  }
  function createFhirClient(global, baseUrl, accessToken, SvcSdkError) {
    function doFetch(url, init) {
      return global.fetch ? global.fetch(url, init) : fetch(url, init);
    }
    async function get(url) {
      if (!baseUrl) {
        throw SvcSdkError("no_fhir_base", "No FHIR base: pass options.fhirBaseUrl (the launch's iss).");
      }
      var response;
      try {
        response = await doFetch(url, {
          method: "GET",
          credentials: "omit",
          headers: { "Authorization": "Bearer " + accessToken, "Accept": "application/fhir+json" }
        });
      } catch (e) {
        throw SvcSdkError("fhir_unreachable", "The FHIR API could not be reached: " + e.message);
      }
      var body = null;
      try {
        body = await response.json();
      } catch (e) {
        body = null;
      }
      if (!response.ok) {
        var issue = body && body.resourceType === "OperationOutcome" && body.issue && body.issue[0];
        throw SvcSdkError(issue && issue.code || "fhir_error", "The FHIR API answered " + response.status + (issue && issue.diagnostics ? ": " + issue.diagnostics : "."), response.status, body);
      }
      return body;
    }
    function checkType(resourceType) {
      if (!RESOURCE_TYPE.test(String(resourceType))) {
        throw SvcSdkError("invalid_resource_type", "Not a FHIR resource type: " + resourceType);
      }
    }
    return {
      baseUrl,
      read: async function(resourceType, id) {
        checkType(resourceType);
        if (typeof id !== "string" || !id) throw SvcSdkError("invalid_id", "read() needs a resource id.");
        return get(baseUrl + "/" + resourceType + "/" + encodeURIComponent(id));
      },
      search: async function(resourceType, params) {
        checkType(resourceType);
        var query = new URLSearchParams();
        var entries = params instanceof URLSearchParams ? Array.from(params.entries()) : Object.entries(params || {});
        entries.forEach(function(pair) {
          (Array.isArray(pair[1]) ? pair[1] : [pair[1]]).forEach(function(value) {
            if (value !== void 0 && value !== null) query.append(pair[0], String(value));
          });
        });
        var text = query.toString();
        return get(baseUrl + "/" + resourceType + (text ? "?" + text : ""));
      }
    };
  }

  // src/core.js
  /*!
   * svc-sdk: the client SDK for apps embedded in the svc-auth host hub (npm package `@svc-auth/sdk`,
   * sdk/js/; the service serves its browser build at /static/sdk/svc-sdk.js). Load it with
   * <script src="{service}/static/sdk/svc-sdk.js"><\/script> (or `import { loadSdk } from "@svc-auth/sdk"`)
   * and call
   *
   *   const instance = await window.svcSdk.initializeSvcSDK({ tokenEndpoint: "/api/token" });
   *   const { idToken } = await instance.sessionContext.getIdToken();
   *
   * What initialization does (spec: "Initialization sequence", step 4 and 5):
   *   1. asks the hub (window.parent) for the launch context: the app token endpoint of the manifest;
   *   2. reads `code` from the page URL and POSTs {"code"} to the app token endpoint (the app's own
   *      backend exchanges it with its client secret, which never reaches the browser);
   *   3. hands the access token to the hub over postMessage; the hub has the platform verify it;
   *   4. resolves with the platform instance once the hub confirms. A 403 from the app token endpoint
   *      (the app refused the user) or 403 trial_expired rejects with an SvcSdkError.
   * The instance's `fhir.read(type, id)` and `fhir.search(type, params)` call the clinic's FHIR API
   * with the access token (src/fhir.js).
   * `options.accessToken` skips steps 1-2 (the identity-provider variant): the hub has the platform
   * verify that access token, and the platform answers with the ID token the service issued with it,
   * which getIdToken() then resolves (an `options.idToken` given by the app wins).
   *
   * Messages are only sent to the platform origin and only accepted from window.parent at that
   * origin. The platform origin is `options.platformOrigin`, else the origin this script was served
   * from (the service serves the SDK and the hub), else the embedding page's origin.
   *
   * This file is the SDK's logic: `createSdk(window)` builds it; src/index.js (ESM/CommonJS) and
   * src/browser.js (script tag: window.svcSdk) are the entry points that build.mjs bundles into dist/.
   */
  function createSdk(global) {
    "use strict";
    var SDK_CHANNEL = "svc-sdk";
    var PLATFORM_CHANNEL = "svc-platform";
    var DEFAULT_TIMEOUT_MS = 15e3;
    var scriptOrigin = (function() {
      try {
        var script = global.document && global.document.currentScript;
        return script && script.src ? new URL(script.src, global.location.href).origin : null;
      } catch (e) {
        return null;
      }
    })();
    function SvcSdkError(code, message, status, body) {
      var error = new Error(message);
      error.name = "SvcSdkError";
      error.code = code;
      error.status = status || null;
      error.body = body || null;
      return error;
    }
    function platformOriginFor(options) {
      if (options.platformOrigin) return new URL(options.platformOrigin).origin;
      if (scriptOrigin && scriptOrigin !== global.location.origin) return scriptOrigin;
      throw SvcSdkError("platform_unknown", "Cannot tell the platform origin: load the SDK from the platform (a script tag) or pass options.platformOrigin.");
    }
    function PlatformChannel(origin, timeoutMs) {
      this.origin = origin;
      this.timeoutMs = timeoutMs;
      this.pending = {};
      this.counter = 0;
      var self = this;
      global.addEventListener("message", function(event) {
        if (event.source !== global.parent || event.origin !== self.origin) return;
        var data = event.data;
        if (!data || data.channel !== PLATFORM_CHANNEL || !self.pending[data.id]) return;
        var waiter = self.pending[data.id];
        delete self.pending[data.id];
        clearTimeout(waiter.timer);
        waiter.resolve(data);
      });
    }
    PlatformChannel.prototype.request = function(type, payload) {
      var self = this;
      var id = "m" + ++self.counter + "-" + Math.random().toString(36).slice(2);
      return new Promise(function(resolve, reject) {
        var timer = setTimeout(function() {
          delete self.pending[id];
          reject(SvcSdkError("platform_timeout", "The platform did not answer '" + type + "' in time."));
        }, self.timeoutMs);
        self.pending[id] = { resolve, timer };
        global.parent.postMessage(
          Object.assign({ channel: SDK_CHANNEL, type, id }, payload || {}),
          self.origin
        );
      });
    };
    PlatformChannel.prototype.notify = function(type, payload) {
      global.parent.postMessage(Object.assign({ channel: SDK_CHANNEL, type }, payload || {}), this.origin);
    };
    function takeCodeFromUrl() {
      var url = new URL(global.location.href);
      var code = url.searchParams.get("code");
      if (code) {
        url.searchParams.delete("code");
        url.searchParams.delete("iss");
        try {
          global.history.replaceState(global.history.state, "", url.toString());
        } catch (e) {
        }
      }
      var error = url.searchParams.get("error");
      return { code, error, description: url.searchParams.get("error_description") };
    }
    async function exchangeCode(tokenEndpoint, code) {
      var response;
      try {
        response = await fetch(tokenEndpoint, {
          method: "POST",
          credentials: "same-origin",
          headers: { "Content-Type": "application/json", "Accept": "application/json" },
          body: JSON.stringify({ code })
        });
      } catch (e) {
        throw SvcSdkError("token_endpoint_unreachable", "The app token endpoint could not be reached: " + e.message);
      }
      var body = null;
      try {
        body = await response.json();
      } catch (e) {
        body = null;
      }
      if (response.status === 403) {
        if (body && body.error === "trial_expired") {
          throw SvcSdkError(
            "trial_expired",
            "403 trial_expired: " + (body.message || "The free trial has ended."),
            403,
            body
          );
        }
        throw SvcSdkError("forbidden", "403 Forbidden: " + (body && body.message || "the application does not authorize this user."), 403, body);
      }
      if (!response.ok || !body || !body.access_token) {
        throw SvcSdkError(body && body.error || "token_exchange_failed", "The app token endpoint answered " + response.status + (body && body.message ? ": " + body.message : "."), response.status, body);
      }
      return body;
    }
    async function initializeSvcSDK(options) {
      options = options || {};
      if (global.parent === global) {
        throw SvcSdkError("not_embedded", "The SDK runs inside the host hub's iframe; open the app from the hub.");
      }
      var channel = new PlatformChannel(platformOriginFor(options), options.timeoutMs || DEFAULT_TIMEOUT_MS);
      var accessToken = options.accessToken || null;
      var idToken = options.idToken || null;
      var verdict = null;
      try {
        if (!accessToken) {
          var found = takeCodeFromUrl();
          if (found.error) {
            throw SvcSdkError(found.error, "Authorization failed: " + found.error + (found.description ? " (" + found.description + ")" : ""));
          }
          if (!found.code) throw SvcSdkError("missing_code", "The page URL has no authorization code.");
          var tokenEndpoint = options.tokenEndpoint || options.appTokenEndpoint;
          if (!tokenEndpoint) {
            var context = await channel.request("context");
            tokenEndpoint = context.tokenEndpoint;
            if (!tokenEndpoint) {
              throw SvcSdkError("no_token_endpoint", "No app token endpoint in the options or the app manifest.");
            }
          }
          var tokens = await exchangeCode(tokenEndpoint, found.code);
          accessToken = tokens.access_token;
          idToken = tokens.id_token;
        }
        verdict = await channel.request("verify", { accessToken });
        if (verdict.type !== "verified") {
          throw SvcSdkError(
            verdict.error || "verification_failed",
            "The platform did not verify the access token: " + (verdict.message || verdict.error || "refused")
          );
        }
        idToken = idToken || verdict.idToken || null;
        if (typeof idToken !== "string" || !idToken) {
          throw SvcSdkError("no_id_token", options.accessToken ? "No ID token: pass options.idToken, or an access token the platform issued with an ID token." : "The app's backend returned no id_token from its token endpoint; it must return both tokens.");
        }
      } catch (error) {
        try {
          channel.notify("error", { error: error.code || "error", message: error.message });
        } catch (e) {
        }
        throw error;
      }
      var token = idToken;
      var fhirBase = fhirBaseFor({
        fhirBaseUrl: options.fhirBaseUrl || verdict.fhirBaseUrl,
        iss: options.iss || verdict.iss,
        svcOrganizationId: options.svcOrganizationId
      }, channel.origin, accessToken, global);
      return {
        platformOrigin: channel.origin,
        sessionContext: {
          getIdToken: function() {
            return Promise.resolve({ idToken: token });
          }
        },
        fhir: createFhirClient(global, fhirBase, accessToken, SvcSdkError)
      };
    }
    var sdk2 = { initializeSvcSDK, loadSdk: initializeSvcSDK, SvcSdkError };
    return sdk2;
  }

  // src/browser.js
  var sdk = createSdk(window);
  window.svcSdk = sdk;
  window.loadSdk = sdk.loadSdk;
})();
