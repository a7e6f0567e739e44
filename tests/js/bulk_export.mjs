// Bulk Data export for the test EHR (fhir_ehr.mjs), a SWITCH: off by default, turned on with
// POST /admin/bulk {export: true, ...}. Medplum's fhir-router has no $export (4.5.2, 5.2.13), so the
// async protocol layer is this file's; the data is Medplum's (each patient's compartment searched
// with its MemoryRepository, as $everything is: fhir_ehr.mjs `compartmentOf`). Only what svc-auth
// calls is served: Patient-level export.
//
// It follows HL7 FHIR Bulk Data Access IG 2.0.0 (https://hl7.org/fhir/uv/bulkdata/export.html):
// - kick-off: `GET|POST [base]/Patient/$export`, `Accept: application/fhir+json` and
//   `Prefer: respond-async` required; parameters `_type`, `_since`, `_outputFormat` and (POST,
//   `Parameters` body) `patient`; 202 with `Content-Location` (the status URL);
// - status: `GET` -> 202 with `X-Progress` and `Retry-After` while running, 200 with the manifest
//   (`transactionTime`, `request`, `requiresAccessToken`, `output` [{type, url, count}], `error`),
//   a 4xx/5xx OperationOutcome when it failed; `DELETE` -> 202 and the job is gone (404 after);
// - file request: `GET` the manifest's URL with the token, `application/fhir+ndjson`.
// And what Epic (https://fhir.epic.com/Documentation?docId=fhir_bulk_data) and Oracle Health
// Millennium (https://docs.oracle.com/en/industries/health/millennium-platform-apis/mfbda/api-bulk-export.html,
// .../op-group-group_id-export-get.html) document of theirs: the token needs a system read scope for
// every type in `_type` (403 otherwise), the status asks the client to poll later with Retry-After,
// files are downloaded with the token, and a DELETE cleans them up; Oracle refuses the `patient`
// parameter (`{patient: "refuse"}` here answers 400 as it does).
//
// Switches (POST /admin/bulk): {export: true|false, polls: N (202s before the manifest),
// retry_after: S, patient: "honour"|"refuse"|"ignore" (ignore: every patient is exported, as a server
// that drops the parameter), fail: null|"status"|"manifest-error", drip_ms: M (a wait per line of a
// file), file_base: URL (the manifest lists its files under this base: another host's, as a hostile
// or misconfigured server would)}. GET /admin/bulk: the switches and the request log ({method, path, ...} of each call).

const jobs = new Map();
let settings = {};
let log = [];
let counter = 0;

export function bulkReset() { settings = { export: false, polls: 1, retry_after: 1, patient: 'honour', fail: null, drip_ms: 0, file_base: null }; jobs.clear(); log = []; }
bulkReset();
export const bulkOn = () => settings.export;
export function bulkAdmin(body) { if (body) Object.assign(settings, body); return { settings, log, jobs: jobs.size }; }

// What the CapabilityStatement says when the switch is on (IG 2.0.0 "Server Capability Documentation").
export function bulkStatement(statement) {
  if (!settings.export) return statement;
  statement.instantiates = ['http://hl7.org/fhir/uv/bulkdata/CapabilityStatement/bulk-data'];
  const patient = statement.rest[0].resource.find((r) => r.type === 'Patient');
  if (patient) patient.operation = [...(patient.operation ?? []), { name: 'patient-export', definition: 'http://hl7.org/fhir/uv/bulkdata/OperationDefinition/patient-export' }];
  return statement;
}

const outcome = (code, text) => ({ resourceType: 'OperationOutcome', issue: [{ severity: code === 'informational' ? 'information' : 'error', code, details: { text } }] });

// Returns true when it answered the request (a bulk path), false to let the FHIR router have it.
// `ctx`: {base, pathname, url, query, body (parsed JSON or null), allows(type), served (types),
// compartmentOf(id), allPatients(), send(res, status, body, type, headers)}.
export async function bulkRequest(req, res, ctx) {
  const { pathname, send } = ctx;
  const isKickoff = pathname === '/Patient/$export';
  const isStatus = pathname.startsWith('/$export-status/');
  const isFile = pathname.startsWith('/$export-file/');
  if (!isKickoff && !isStatus && !isFile) return false;
  log.push({ method: req.method, path: pathname });
  if (!settings.export) { send(res, 404, outcome('not-supported', 'Bulk Data export is not offered here.')); return true; }
  if (isKickoff) return kickOff(req, res, ctx);
  const id = pathname.split('/')[2];
  const job = jobs.get(id);
  if (!job) { send(res, 404, outcome('not-found', 'No such export.')); return true; }
  if (isStatus) {
    if (req.method === 'DELETE') { jobs.delete(id); send(res, 202, outcome('informational', 'Deleted.')); return true; }
    if (settings.fail === 'status') { send(res, 500, outcome('exception', 'The export failed.')); return true; }
    if (job.polls < settings.polls) {
      job.polls += 1;
      res.setHeader('Retry-After', String(settings.retry_after));
      res.setHeader('X-Progress', `poll ${job.polls} of ${settings.polls}`);
      send(res, 202, '');
      return true;
    }
    const output = Object.entries(job.files).map(([type, lines]) => ({ type, url: `${settings.file_base ?? ctx.base}/$export-file/${id}/${type}.ndjson`, count: lines.length }));
    const error = settings.fail === 'manifest-error' ? [{ type: 'OperationOutcome', url: `${ctx.base}/$export-file/${id}/errors.ndjson` }] : [];
    send(res, 200, { transactionTime: job.transactionTime, request: job.request, requiresAccessToken: true, output, error }, 'application/json');
    return true;
  }
  const type = pathname.split('/')[3]?.replace(/\.ndjson$/, '');
  if (!job.files[type]) { send(res, 404, outcome('not-found', 'No such file.')); return true; }
  if (!ctx.allows(type)) { send(res, 403, outcome('forbidden', `The access token lacks the scope of ${type}.`)); return true; }
  res.writeHead(200, { 'Content-Type': 'application/fhir+ndjson' });
  for (const line of job.files[type]) {
    if (settings.drip_ms) await new Promise((resolve) => setTimeout(resolve, settings.drip_ms));
    res.write(line + '\n');
  }
  res.end();
  return true;
}

function parameterValues(ctx) {
  const values = {};
  for (const [k, v] of Object.entries(ctx.query)) values[k] = [].concat(v);
  if (ctx.body?.resourceType === 'Parameters') {
    for (const p of ctx.body.parameter ?? []) {
      const value = p.valueReference?.reference ?? p.valueString ?? p.valueInstant ?? p.valueCode;
      (values[p.name] ??= []).push(value);
    }
  }
  return values;
}

async function kickOff(req, res, ctx) {
  const { send } = ctx;
  if (req.headers.prefer?.split(',').map((s) => s.trim()).includes('respond-async') !== true) {
    send(res, 400, outcome('invalid', 'Prefer: respond-async is required.')); return true;
  }
  const values = parameterValues(ctx);
  const asked = values._type ? values._type.join(',').split(',').filter(Boolean) : ctx.served.filter((t) => ctx.allows(t));
  const unknown = asked.filter((t) => !ctx.served.includes(t));
  if (unknown.length) { send(res, 400, outcome('invalid', `Unknown _type ${unknown.join(',')}.`)); return true; }
  const refused = asked.filter((t) => !ctx.allows(t));  // Oracle, Epic: a system read scope per _type type
  if (refused.length) { send(res, 403, outcome('forbidden', `The access token lacks the scopes of ${refused.join(',')}.`)); return true; }
  let patients = null;
  if (values.patient?.length) {
    if (settings.patient === 'refuse') { send(res, 400, outcome('not-supported', 'The patient parameter is not supported.')); return true; }
    if (settings.patient === 'honour') patients = values.patient.map((r) => r.split('/').pop());
  }
  const since = values._since?.[0] ? Date.parse(values._since[0]) : null;
  const files = {};
  for (const id of patients ?? await ctx.allPatients()) {
    let compartment;
    try { compartment = await ctx.compartmentOf(id); } catch { continue; }  // an unknown patient: nothing
    for (const resource of compartment) {
      if (!asked.includes(resource.resourceType)) continue;
      if (since !== null && Date.parse(resource.meta?.lastUpdated ?? '') < since) continue;
      (files[resource.resourceType] ??= []).push(JSON.stringify(resource));
    }
  }
  const id = `job-${++counter}`;
  jobs.set(id, { files, polls: 0, transactionTime: new Date().toISOString(), request: ctx.url.toString() });
  res.setHeader('Content-Location', `${ctx.base}/$export-status/${id}`);
  send(res, 202, outcome('informational', 'Accepted.'));
  return true;
}
