// Vendor behaviours of the test EHR (fhir_ehr.mjs), switched on with FHIR_EHR_VENDOR=oracle|epic|athena
// (unset: the generic FHIR R4 server). Each is what the vendor documents, cited beside it; the
// rest of the server stays Medplum's real search. `vendorRequest` sees a FHIR request before
// Medplum does and either refuses it as the vendor would, or rewrites its query to the vendor's
// semantics; `vendorScopes` and `vendorSmart` shape the token service and its discovery.

export const VENDORS = ['oracle', 'epic', 'athena'];
export const ATHENA_PRACTICE = process.env.FHIR_EHR_PRACTICE || '195900';

const TYPES = ['Practitioner', 'Appointment', 'Patient', 'Encounter', 'Condition', 'Observation',
  'MedicationRequest', 'AllergyIntolerance', 'DocumentReference'];

const outcome = (code, text) => ({ resourceType: 'OperationOutcome', issue: [{ severity: 'error', code, details: { text } }] });

// The FHIR base's path. Epic's bases end in /api/FHIR/R4 after the Interconnect base (research
// epic_schedules.md E9: `…/interconnect-fhir-oauth/api/FHIR/R4`), where Epic's web services live too:
// GetProviderAppointments is epic_scheduling.mjs (shapes from the research's source E6).
export function vendorBasePath(vendor) {
  return vendor === 'epic' ? '/api/FHIR/R4' : '/fhir/R4';
}

// The scopes the token service knows (a scope it does not know is dropped from a grant, so a
// client asking v2 scopes of a v1-only server gets a token with no scope, and 403s).
export function vendorScopes(vendor) {
  // Oracle Health (Millennium) documents SMART v1 `system/{Type}.read` scopes for system accounts
  // (fhir.cerner.com: content/authorization.md, "Requesting scopes", client_credentials example).
  if (vendor === 'oracle') return TYPES.map((t) => `system/${t}.read`);
  return TYPES.map((t) => `system/${t}.rs`);
}

// `.well-known/smart-configuration` additions (SMART App Launch 2.0, "capabilities":
// permission-v1 / permission-v2; https://hl7.org/fhir/smart-app-launch/conformance.html).
export function vendorSmart(vendor) {
  if (vendor === 'oracle') return { capabilities: ['client-confidential-asymmetric', 'permission-v1'], scopes_supported: vendorScopes(vendor) };
  return { capabilities: ['client-confidential-asymmetric', 'permission-v2'], scopes_supported: vendorScopes(vendor) };
}

// Whether the vendor's CapabilityStatement offers Patient/$everything to this client.
export function vendorOffersEverything(vendor) {
  // Epic and Millennium document no Patient $everything for backend (system) clients; charts are
  // searched per type. athena: none documented either (docs.athenahealth.com/api/fhir-r4).
  return !VENDORS.includes(vendor);
}

// The scope a request on `type` needs, or null (metadata, discovery, the admin controls).
export function neededScope(vendor, type) {
  if (!/^[A-Z][A-Za-z]{1,63}$/.test(type)) return null;  // every resource type needs its scope
  return vendor === 'oracle' ? `system/${type}.read` : `system/${type}.rs`;
}

// null: serve the request (after `query` was rewritten in place); else [status, body, contentType].
export function vendorRequest(vendor, type, pathname, query) {
  const search = pathname === `/${type}`;  // a type-level search (not a read, not an operation)
  if (vendor === 'oracle') {
    // Millennium: "If `_id` is provided, no other parameters may be provided"
    // (fhir.cerner.com: content/millennium/r4/clinical/diagnostics/observation.md, condition.md).
    if (search && '_id' in query && Object.keys(query).length > 1) {
      return [400, outcome('invalid', 'The _id parameter cannot be combined with other parameters.')];
    }
    if (search && type === 'Appointment') {
      // Appointment search parameters: _id, patient, practitioner, location, date,
      // -date-or-req-period, status, _count; no _include (it is not served: ignored here).
      // `date` returns appointments other than `proposed`; `-date-or-req-period` returns the same
      // and the proposed ones (content/millennium/r4/base/workflow/appointment.md, Search notes).
      delete query._include;
      if ('-date-or-req-period' in query) {
        query.date = query['-date-or-req-period'];
        delete query['-date-or-req-period'];
      } else if ('date' in query) {
        query['status:not'] = 'proposed';
      }
    }
  }
  if (vendor === 'epic') {
    // Epic: Observation search needs `patient` and `category` (or `code`)
    // (open.epic.com/Clinical/Observation, Observation.Search parameters).
    if (search && type === 'Observation' && !('_id' in query) && !('category' in query) && !('code' in query)) {
      return [400, outcome('required', 'A category or code parameter is required for this search.')];
    }
    // Epic documents Appointment searches by patient, not by provider: no standard FHIR R4 search
    // of a provider's schedule (issue 26, item 7; integrators use Epic's own scheduling APIs).
    if (search && type === 'Appointment' && 'practitioner' in query) {
      return [400, outcome('not-supported', 'The practitioner search parameter is not supported.')];
    }
  }
  if (vendor === 'athena' && search) {
    // athenahealth: every search names its practice, `ah-practice=Organization/a-1.Practice-{id}`
    // (fhir.athena.io/athenacoreext/StructureDefinition-ah-practice.html); without it the API
    // answers 400 with its own JSON error body, not an OperationOutcome.
    const practice = [].concat(query['ah-practice'] ?? []);
    if (practice.length !== 1 || practice[0] !== `Organization/a-1.Practice-${ATHENA_PRACTICE}`) {
      return [400, { error: 'Could not determine what practice the request was for.', detailedmessage: 'ah-practice is required' }, 'application/json'];
    }
    delete query['ah-practice'];
  }
  return null;
}
