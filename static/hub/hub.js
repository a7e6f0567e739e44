// Sandbox EHR hub: lists the clinic's apps, opens one in the iframe, and answers its SDK.
//
// SDK protocol (postMessage; both sides check origin and source):
//   app -> hub  {channel:"svc-sdk", type:"context", id}          hub -> app {channel:"svc-platform", type:"context", id, tokenEndpoint, clientId, organizationId}
//   app -> hub  {channel:"svc-sdk", type:"verify", id, accessToken}
//                                     hub -> app {channel:"svc-platform", type:"verified"|"rejected", id, idToken?, error?, message?}
//   app -> hub  {channel:"svc-sdk", type:"error", error, message}  (the SDK failed; shown in the hub)
// The hub verifies the access token with POST {base}/oauth/introspect using the user's sandbox
// token as Bearer: that is the platform verification. Its answer carries the ID token the service
// issued with that access token, which `verified` hands to the app's SDK (identity-provider variant:
// the SDK only got the access token). The hub never sees the client secret.
(function () {
  "use strict";

  var data = JSON.parse(document.getElementById("hub-data").textContent);
  var frame = document.getElementById("app-frame");
  var statusLine = document.getElementById("hub-status");
  var apps = {};
  var current = null; // the entry whose launch is in the frame

  function setStatus(text) { statusLine.textContent = text; }

  function indexApps(list) {
    apps = {};
    list.forEach(function (entry) { apps[entry.application_id] = entry; });
  }

  function renderEntry(entry) {
    var button = document.getElementById("app-entry-" + entry.application_id);
    if (!button) return;
    button.setAttribute("aria-disabled", entry.openable ? "false" : "true");
    button.classList.toggle("disabled", !entry.openable);
    button.title = entry.openable ? "Open " + entry.name : entry.name + " is Disabled in this clinic";
    button.querySelector(".app-status").textContent = entry.activation_status || "New";
  }

  async function refreshApps() {
    try {
      var response = await fetch(data.appsUrl, { headers: { "Authorization": "Bearer " + data.sandboxToken } });
      if (!response.ok) return;
      var body = await response.json();
      indexApps(body.apps);
      body.apps.forEach(renderEntry);
    } catch (error) {
      // Offline for a moment: the next refresh catches up.
    }
  }

  // patientId (optional): the patient in context (an appointment row's Open button).
  async function openApp(applicationId, patientId) {
    var entry = apps[applicationId];
    if (!entry) { setStatus("That app is not installed in this clinic."); return; }
    if (!entry.openable) { setStatus(entry.name + " is Disabled in this clinic and cannot be opened."); return; }
    setStatus("Launching " + entry.name + "…");
    var response = await fetch(data.apiBase + "/sandbox/launches", {
      method: "POST",
      headers: { "Authorization": "Bearer " + data.sandboxToken, "Content-Type": "application/json" },
      body: JSON.stringify(patientId ? { client_id: entry.client_id, patient_id: patientId }
                                     : { client_id: entry.client_id })
    });
    var body = await response.json().catch(function () { return {}; });
    if (response.status !== 201) {
      setStatus("Could not open " + entry.name + ": " + (body.message || response.status));
      return;
    }
    document.querySelectorAll(".app-entry.active").forEach(function (b) { b.classList.remove("active"); });
    var button = document.getElementById("app-entry-" + applicationId);
    if (button) button.classList.add("active");
    current = entry;
    frame.hidden = false;
    frame.title = entry.name;
    frame.src = body.launch_url;
  }

  function reply(event, message) {
    message.channel = "svc-platform";
    event.source.postMessage(message, event.origin);
  }

  async function verify(event, accessToken) {
    var entry = current;
    var response = await fetch(data.apiBase + "/oauth/introspect", {
      method: "POST",
      headers: { "Authorization": "Bearer " + data.sandboxToken, "Content-Type": "application/json" },
      body: JSON.stringify({ token: String(accessToken || "") })
    });
    var result = await response.json().catch(function () { return {}; });
    if (response.ok && result.active && result.client_id === entry.client_id && result.sub === data.user.id) {
      reply(event, { type: "verified", id: event.data.id, idToken: result.id_token || null });
      setStatus(entry.name + " is open; the platform verified its access token.");
    } else {
      reply(event, { type: "rejected", id: event.data.id, error: "invalid_token",
                     message: result.message || "The access token is not active for this user and app." });
      setStatus(entry.name + ": the platform could not verify the app's access token.");
    }
    refreshApps();
  }

  window.addEventListener("message", function (event) {
    // Only the app we framed, at an origin of its registered redirect URIs (the manifest's, or in
    // exact mode any of them: authorize may have sent the frame to each).
    if (!current || event.source !== frame.contentWindow) return;
    var origins = current.app_origins || [current.app_origin];
    if (origins.indexOf(event.origin) === -1) return;
    var message = event.data;
    if (!message || message.channel !== "svc-sdk") return;
    if (message.type === "context") {
      reply(event, { type: "context", id: message.id, tokenEndpoint: current.token_endpoint,
                     clientId: current.client_id, organizationId: data.organizationId || null });
    } else if (message.type === "verify") {
      verify(event, message.accessToken);
    } else if (message.type === "error") {
      setStatus(current.name + " did not start: " + (message.message || message.error));
    }
  });

  document.getElementById("app-list").addEventListener("click", function (event) {
    var button = event.target.closest(".app-entry");
    if (!button) return;
    if (button.getAttribute("aria-disabled") === "true") {
      setStatus(button.querySelector(".app-name").textContent + " is Disabled in this clinic and cannot be opened.");
      return;
    }
    openApp(button.getAttribute("data-application-id"));
  });

  var table = document.getElementById("appointments");
  if (table) {
    table.addEventListener("click", function (event) {
      var button = event.target.closest(".open-for-patient");
      if (!button) return;
      openApp(button.getAttribute("data-application-id"), button.getAttribute("data-patient-id"));
    });
  }

  indexApps(data.apps);
  if (data.openApp) openApp(data.openApp);
  // An app that enables or disables itself (REST activation operation) shows up without a reload.
  if (data.refreshSeconds > 0) setInterval(refreshApps, data.refreshSeconds * 1000);
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") refreshApps();
  });
})();
