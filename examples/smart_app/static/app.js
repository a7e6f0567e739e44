// The redirect URI: fhirclient exchanges the code (a public client: client_id and the PKCE
// verifier in the form body, no secret), then this page checks the user against the app's own
// list and reads the launch's patient from the FHIR API.
"use strict";

function show(id, text) {
  const element = document.getElementById(id);
  if (text !== undefined) element.textContent = text;
  element.hidden = false;
  return element;
}

function status(text) {
  document.getElementById("smart-status").textContent = text;
}

function humanName(patient) {
  const name = (patient.name || []).find(n => n.use === "official") || (patient.name || [])[0] || {};
  if (name.text) return name.text;
  return [...(name.given || []), name.family].filter(Boolean).join(" ");
}

// SMART refresh (online_access): the next access token, with the same patient, from the refresh
// token; the token endpoint rotates it. A public client names itself with client_id.
async function refreshAndReread(client, patientId) {
  const button = document.getElementById("smart-refresh");
  button.disabled = true;
  try {
    await client.refresh();
    const patient = await client.request("Patient/" + encodeURIComponent(patientId));
    const refreshed = show("smart-refreshed", "Access token refreshed; read " + humanName(patient) + " again.");
    refreshed.dataset.count = String(Number(refreshed.dataset.count || "0") + 1);
  } catch (error) {
    show("smart-error", "Refresh failed: " + String(error && error.message || error));
  } finally {
    button.disabled = false;
  }
}

async function main() {
  FHIR.oauth2.settings.refreshTokenWithClientId = true;
  const configResponse = await fetch("config.json");
  if (!configResponse.ok) throw new Error("config.json: HTTP " + configResponse.status);
  const config = await configResponse.json();
  const client = await FHIR.oauth2.ready();
  // The ID token (openid fhirUser) names the user as a FHIR resource URL. This check is the app's
  // own decision whom it serves; the FHIR API itself only ever serves the token's clinic.
  const idToken = client.getIdToken() || {};
  const fhirUser = idToken.fhirUser || "";
  if (!config.authorizedUsers.includes(fhirUser)) {
    status("Not authorized.");
    show("smart-refused-reason", "This user (" + (fhirUser || idToken.sub || "unknown") +
         ") is not authorized to use Example SMART App.");
    show("smart-refused");
    return;
  }
  const patientId = client.patient.id;
  if (!patientId) throw new Error("The launch has no patient context: open the app from a patient's row.");
  const patient = await client.request("Patient/" + encodeURIComponent(patientId));
  document.getElementById("smart-patient-name").textContent = humanName(patient);
  document.getElementById("smart-patient-birth-date").textContent = patient.birthDate || "";
  document.getElementById("smart-patient-id").textContent = patient.id;
  document.getElementById("smart-user").textContent = "Signed in as " + fhirUser;
  const section = show("smart-patient");
  section.dataset.patientId = patient.id;
  document.getElementById("smart-refresh").addEventListener("click", () => refreshAndReread(client, patient.id));
  status("Launched.");
}

main().catch(error => {
  status("The launch failed.");
  show("smart-error", String(error && error.message || error));
});
