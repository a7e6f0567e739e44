// The launch URL: the EHR opens it with `iss` (the clinic's FHIR base) and `launch`. fhirclient
// reads {iss}/.well-known/smart-configuration and redirects to the authorize endpoint with
// response_type=code, client_id, scope, redirect_uri, aud=iss, state, launch and PKCE S256.
"use strict";

function showError(error) {
  const element = document.getElementById("smart-error");
  element.textContent = String(error && error.message || error);
  element.hidden = false;
  document.getElementById("smart-status").textContent = "The launch failed.";
}

fetch("config.json")
  .then(response => response.ok ? response.json() : Promise.reject(new Error("config.json: HTTP " + response.status)))
  .then(config => FHIR.oauth2.authorize({
    clientId: config.clientId,
    scope: config.scope,
    redirectUri: "index.html",
    pkceMode: "required",      // a public client: never without PKCE S256
    completeInTarget: true,    // the app runs in the hub's iframe and completes there
  }))
  .catch(showError);
