// Example Partner App front end: initialize the SDK, show the ID token claims, then SSO into the
// app's own session and offer "Enable for this clinic".
(function () {
  "use strict";

  function $(id) { return document.getElementById(id); }

  function decodeJwtPayload(jwt) {
    var part = jwt.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    while (part.length % 4) part += "=";
    var bytes = Uint8Array.from(atob(part), function (c) { return c.charCodeAt(0); });
    return JSON.parse(new TextDecoder().decode(bytes));
  }

  async function postJson(path, bearer) {
    var response = await fetch(path, {
      method: "POST",
      headers: { "Authorization": "Bearer " + bearer, "Content-Type": "application/json" },
      body: "{}"
    });
    var body = await response.json().catch(function () { return {}; });
    if (!response.ok) {
      throw new Error(response.status + " " + (body.error || "error") + ": " + (body.message || ""));
    }
    return body;
  }

  // Identity-provider variant (launch URL with ?variant=identity-provider sets a cookie, see web.py): the app's
  // own code exchanges the authorization code through its backend and hands the SDK only the
  // access token; getIdToken() still resolves the ID token, which the platform returns.
  async function identityProviderTokens() {
    if (!/(^|;\s*)sdk_variant=identity-provider(;|$)/.test(document.cookie)) return null;
    var url = new URL(window.location.href);
    var code = url.searchParams.get("code");
    url.searchParams.delete("code");
    window.history.replaceState(null, "", url.toString());
    var response = await fetch("/api/token", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ code: code })
    });
    var body = await response.json().catch(function () { return {}; });
    if (!response.ok) throw new Error(response.status + " " + (body.error || "error") + ": " + (body.message || ""));
    $("backend-id-token").textContent = body.id_token;
    return body;
  }

  async function start() {
    var sdk;
    try {
      var tokens = await identityProviderTokens();
      // The token endpoint comes from the app manifest (the hub tells the SDK); pass
      // { tokenEndpoint: "/api/token" } to set it here instead.
      sdk = await window.svcSdk.initializeSvcSDK(tokens ? { accessToken: tokens.access_token } : undefined);
    } catch (error) {
      $("sdk-status").textContent = "The SDK did not initialize.";
      $("sdk-error").textContent = error.message;
      $("refused").hidden = false;
      return;
    }
    var idToken = (await sdk.sessionContext.getIdToken()).idToken;
    $("sdk-id-token").textContent = idToken || "";
    var claims = decodeJwtPayload(idToken);
    $("id-token-claims").textContent = JSON.stringify(claims, null, 2);
    $("sdk-status").textContent = "Signed in as " + (claims.given_name || "") + " " + (claims.family_name || "") +
      " <" + claims.email + ">";
    $("welcome").hidden = false;

    // Optional SSO step: the ID token buys the app's own session.
    var session;
    try {
      session = await postJson("/api/session", idToken);
      $("app-session").textContent = "App session open for " + session.user.sub + ".";
    } catch (error) {
      $("app-session").textContent = "No app session: " + error.message;
      return;
    }
    var button = $("enable-clinic");
    button.disabled = false;
    button.addEventListener("click", async function () {
      button.disabled = true;
      $("activation-result").textContent = "Enabling…";
      try {
        var result = await postJson("/api/activation", session.session_token);
        $("activation-result").textContent = "Activation status: " + result.status +
          (result.trial_started_at ? " (trial started " + result.trial_started_at + ")" : "");
      } catch (error) {
        $("activation-result").textContent = "Could not enable: " + error.message;
        button.disabled = false;
      }
    });
  }

  start();
})();
