/**
 * The platform FHIR R4 API from the app's browser code: `instance.fhir` of an initialized SDK.
 *
 *   const patient = await instance.fhir.read("Patient", "pat-b15c092f2447b7a2");
 *   const bundle = await instance.fhir.search("Condition", { patient: patient.id, _count: 20 });
 *
 * Each call sends the instance's access token (`Authorization: Bearer`) to the clinic's FHIR base
 * and resolves the JSON (a resource, or a searchset Bundle). An error answer rejects with an
 * SvcSdkError whose `body` is the OperationOutcome and whose `code` is its first issue's code.
 * The FHIR base is `options.fhirBaseUrl` (or `options.iss`, the SMART launch's), else
 * `{platform origin}/fhir/r4/{svc organization id}` with the organization id of the access token.
 * The app's origin must be registered with the application (`--allowed-origin`) for CORS.
 */

var RESOURCE_TYPE = /^[A-Z][A-Za-z]{1,63}$/;

/** The `org` claim of a JWT access token (read, not verified: the server verifies it), or null. */
export function organizationOf(accessToken, global) {
  try {
    var payload = String(accessToken).split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    var decode = (global && global.atob) || atob;
    var claims = JSON.parse(decode(payload + "===".slice((payload.length + 3) % 4)));
    return typeof claims.org === "string" ? claims.org : null;
  } catch (e) {
    return null;
  }
}

export function fhirBaseFor(options, platformOrigin, accessToken, global) {
  var explicit = options.fhirBaseUrl || options.iss;
  if (explicit) return String(explicit).replace(/\/+$/, "");
  var org = options.svcOrganizationId || organizationOf(accessToken, global);
  return org ? platformOrigin + "/fhir/r4/" + encodeURIComponent(org) : null;
}

export function createFhirClient(global, baseUrl, accessToken, SvcSdkError) {
  function doFetch(url, init) {  // looked up per call: the window's fetch, else the global one
    return global.fetch ? global.fetch(url, init) : fetch(url, init);
  }

  async function get(url) {
    if (!baseUrl) {
      throw SvcSdkError("no_fhir_base", "No FHIR base: pass options.fhirBaseUrl (the launch's iss).");
    }
    var response;
    try {
      response = await doFetch(url, { method: "GET", credentials: "omit",
        headers: { "Authorization": "Bearer " + accessToken, "Accept": "application/fhir+json" } });
    } catch (e) {
      throw SvcSdkError("fhir_unreachable", "The FHIR API could not be reached: " + e.message);
    }
    var body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) {
      var issue = body && body.resourceType === "OperationOutcome" && body.issue && body.issue[0];
      throw SvcSdkError((issue && issue.code) || "fhir_error", "The FHIR API answered " + response.status +
        (issue && issue.diagnostics ? ": " + issue.diagnostics : "."), response.status, body);
    }
    return body;
  }

  function checkType(resourceType) {
    if (!RESOURCE_TYPE.test(String(resourceType))) {
      throw SvcSdkError("invalid_resource_type", "Not a FHIR resource type: " + resourceType);
    }
  }

  return {
    baseUrl: baseUrl,
    read: async function (resourceType, id) {
      checkType(resourceType);
      if (typeof id !== "string" || !id) throw SvcSdkError("invalid_id", "read() needs a resource id.");
      return get(baseUrl + "/" + resourceType + "/" + encodeURIComponent(id));
    },
    search: async function (resourceType, params) {
      checkType(resourceType);
      var query = new URLSearchParams();
      var entries = params instanceof URLSearchParams ? Array.from(params.entries()) : Object.entries(params || {});
      entries.forEach(function (pair) {
        (Array.isArray(pair[1]) ? pair[1] : [pair[1]]).forEach(function (value) {
          if (value !== undefined && value !== null) query.append(pair[0], String(value));
        });
      });
      var text = query.toString();
      return get(baseUrl + "/" + resourceType + (text ? "?" + text : ""));
    }
  };
}
