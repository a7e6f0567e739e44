// Epic's GetProviderAppointments web service on the test EHR (the `epic` vendor switch, vendors.mjs),
// answering from the Practitioners, Appointments and Patients seeded in Medplum's repository, so the
// data underneath is real FHIR searched by Medplum.
//
// Shapes as Ronin's production Epic client shows them (research/epic_schedules.md, source E6:
// The-Ronin-Project/interop-ehr @292a278484be3640a74ffcddaec24f469ebd8114, interop-ehr-epic/.../epic/):
// - POST {Interconnect base}/api/epic/2013/Scheduling/Provider/GetProviderAppointments/Scheduling/Provider/Appointments
//   (EpicAppointmentService.kt:70-71), the backend-services bearer token (client/EHRClient.kt:98-101);
// - request (apporchard/model/GetProviderAppointmentRequest.kt:11-31): UserID, UserIDType ("External"),
//   StartDate/EndDate "MM/dd/yyyy", Providers [{ID, IDType ("External")}], IncludeAllStatuses "true";
// - answer (GetAppointmentsResponse.kt:14-19): {"Error", "Appointments"}, Appointments null on failure;
//   an appointment (EpicAppointment.kt:13-25, ExampleProviderAppointmentBundle.json): AppointmentDuration
//   (minutes, a string), AppointmentNotes, AppointmentStartTime (" 2:00 PM"), AppointmentStatus
//   ("Scheduled"), ContactIDs [{ID, Type: CSN|ASN}], Date ("2/1/2022"), PatientIDs [{ID: "     Z6156",
//   Type: Internal}, {Type: ExternalKey}], PatientName ("TEST,INTOUCH"), Providers [{DepartmentIDs,
//   DepartmentName, Duration, ProviderIDs, ProviderName, Time}], VisitTypeIDs, VisitTypeName.
// Epic's own page of this web service (apporchard.epic.com/Sandbox?api=202) is not public; what the test
// EHR does where E6 is silent is this file's choice, said beside it.

export const GET_PROVIDER_APPOINTMENTS =
  '/api/epic/2013/Scheduling/Provider/GetProviderAppointments/Scheduling/Provider/Appointments';

const NPI_SYSTEM = 'http://hl7.org/fhir/sid/us-npi';
const DATE = /^(\d{2})\/(\d{2})\/(\d{4})$/;   // MM/dd/yyyy (E6: DateTimeFormatter.ofPattern("MM/dd/yyyy"))
// FHIR status -> what Epic shows (the inverse of Ronin's map, EpicAppointmentService.kt:453-483;
// `pending`, `waitlist`, `entered-in-error` have no Epic name there: this file's choice).
const EPIC_STATUS = { proposed: 'Proposed', pending: 'Scheduled', booked: 'Scheduled', arrived: 'Arrived',
  'checked-in': 'Present', fulfilled: 'Completed', cancelled: 'Canceled', noshow: 'No Show',
  'entered-in-error': 'Canceled', waitlist: 'Scheduled' };

const DEFAULTS = () => ({
  user_id: 'SVCAUTH',                 // the Epic user the clinic created for svc-auth
  time_zone: 'UTC',                   // the Epic instance's local time zone (Date, AppointmentStartTime)
  patient_system: 'urn:oid:1.2.840.114350.1.13.0.1.7.5.737384.0',  // the Patient identifier holding the Internal id
  provider_system: null,              // an External provider id's system (else identifier type.text EXTERNAL)
  fhir_patient_ids: false,            // add a PatientIDs entry of Type FHIR (none in E6's sample)
  statuses: {},                       // appointment id -> the AppointmentStatus to show instead
  durations: {},                      // appointment id -> the AppointmentDuration to show instead (any JSON value)
  overrides: {},                      // appointment id -> {member: value} shown instead of what it renders
  error: null,                        // refuse every call: {"Error": error, "Appointments": null} ...
  error_status: 200,                  // ... with this HTTP status
  restricted: [],                     // Patient ids whose FHIR Patient.Read answers 403 (restrictedRead)
});

// A restricted patient ("break-the-glass": a confidential or VIP patient, a hospital employee, a
// department the backend user cannot see): Epic answers that patient's Patient.Read with an
// OperationOutcome, while every other patient reads fine. Epic's FHIR error-code registry (code
// 4131, severity Fatal: "The patient you are attempting to access is restricted. You must break the
// glass to access patient data.", "returned when you attempt a Patient.Read on that patient"; 4130
// for Break-the-Glass security on other resources), captured from https://fhir.epic.com/Specifications
// and https://fhir.epic.com/Documentation?docId=troubleshooting in api-evangelist/epic-systems
// `errors/epic-systems-error-codes.yml` @e75c10ac2aceab4ef651a7bbc8363d9f4c1739d9. The HTTP status
// (403) and the issue code `forbidden` are this file's choice: that registry gives only Epic's code.
const RESTRICTED_TEXT = 'The patient you are attempting to access is restricted. You must break the glass to access patient data.';

function localParts(instant, timeZone) {
  const parts = Object.fromEntries(new Intl.DateTimeFormat('en-US', { timeZone, year: 'numeric', month: 'numeric',
    day: 'numeric', hour: 'numeric', minute: '2-digit', hour12: true }).formatToParts(new Date(instant))
    .map((p) => [p.type, p.value]));
  const month = Number(parts.month); const day = Number(parts.day); const year = Number(parts.year);
  return { date: `${month}/${day}/${year}`, key: year * 10000 + month * 100 + day,
    time: `${parts.hour.padStart(2, ' ')}:${parts.minute} ${parts.dayPeriod}` };  // " 9:05 AM", as E6's " 2:00 PM"
}

const text = (concept) => concept?.text ?? concept?.coding?.[0]?.display ?? '';
const upperName = (resource, sep) => {
  const name = resource?.name?.[0] ?? {};
  return `${(name.family ?? '').toUpperCase()}${sep}${(name.given ?? []).join(' ').toUpperCase()}`;
};

export class EpicScheduling {
  constructor(repo, parseSearchRequest) {
    this.repo = repo;
    this.parse = parseSearchRequest;
    this.reset();
  }

  reset() { this.settings = DEFAULTS(); this.calls = []; }

  // /admin/epic {settings...}: changes the given settings; GET: the settings and the calls received.
  configure(body) { Object.assign(this.settings, body); }

  report() { return { settings: this.settings, calls: this.calls }; }

  // [403, OperationOutcome] for a read of a restricted Patient (`restricted`), else null.
  restrictedRead(method, pathname) {
    const [, type, id, more] = pathname.split('/');
    if (method !== 'GET' || type !== 'Patient' || !id || more !== undefined || !this.settings.restricted.includes(id)) return null;
    return [403, { resourceType: 'OperationOutcome', issue: [{ severity: 'fatal', code: 'forbidden',
      details: { coding: [{ code: '4131', display: RESTRICTED_TEXT }], text: RESTRICTED_TEXT } }] }];
  }

  async search(query) { return ((await this.repo.search(this.parse(query))).entry ?? []).map((e) => e.resource); }

  async practitioner({ ID, IDType }) {
    if (String(IDType).toUpperCase() === 'NPI') return (await this.search(`Practitioner?identifier=${NPI_SYSTEM}|${ID}`))[0];
    const system = this.settings.provider_system;
    return (await this.search('Practitioner?_count=1000')).find((p) => (p.identifier ?? []).some((i) => i.value === ID
      && (system ? i.system === system : String(i.type?.text ?? '').toUpperCase() === 'EXTERNAL')));
  }

  // [HTTP status, JSON answer] for a request body (already authorized by the caller).
  async answer(body) {
    this.calls.push(body);
    const s = this.settings;
    if (s.error) return [s.error_status, { Error: s.error, Appointments: null }];
    if (!body || typeof body !== 'object' || Array.isArray(body)) return [400, { Error: 'The request body must be a JSON object.', Appointments: null }];
    // A malformed request: HTTP 400 with Error (this file's choice; E6 only shows Error with Appointments null).
    const start = DATE.exec(body.StartDate ?? ''); const end = DATE.exec(body.EndDate ?? '');
    if (!start || !end) return [400, { Error: 'StartDate and EndDate must be MM/dd/yyyy.', Appointments: null }];
    if (!Array.isArray(body.Providers) || !body.Providers.length || body.Providers.some((p) => !p?.ID)) {
      return [400, { Error: 'Providers must name at least one provider ID.', Appointments: null }];
    }
    if (body.UserID !== s.user_id || typeof body.UserIDType !== 'string') {
      return [200, { Error: `User ${body.UserID} of type ${body.UserIDType} was not found.`, Appointments: null }];
    }
    const first = Number(start[3]) * 10000 + Number(start[1]) * 100 + Number(start[2]);
    const last = Number(end[3]) * 10000 + Number(end[1]) * 100 + Number(end[2]);
    const all = String(body.IncludeAllStatuses).toLowerCase() === 'true';
    const appointments = [];
    for (const wanted of body.Providers) {
      const practitioner = await this.practitioner(wanted);
      if (!practitioner) return [200, { Error: `No provider has ID ${wanted.ID} of type ${wanted.IDType ?? 'External'}.`, Appointments: null }];
      // Medplum searches a UTC range a day wider on each side; the local dates decide.
      const from = new Date(Date.UTC(Number(start[3]), Number(start[1]) - 1, Number(start[2]) - 1)).toISOString();
      const to = new Date(Date.UTC(Number(end[3]), Number(end[1]) - 1, Number(end[2]) + 2)).toISOString();
      const found = await this.search(`Appointment?practitioner=Practitioner/${practitioner.id}&date=ge${from}&date=lt${to}&_count=1000`);
      for (const appointment of found) {
        const local = localParts(appointment.start, s.time_zone);
        if (local.key < first || local.key > last) continue;
        const status = s.statuses[appointment.id] ?? EPIC_STATUS[appointment.status] ?? appointment.status;
        if (!all && !['Scheduled', 'Arrived', 'Present'].includes(status)) continue;
        appointments.push({ ...await this.render(appointment, practitioner, local, status),
          ...s.overrides[appointment.id] });
      }
    }
    return [200, { Error: null, Appointments: appointments }];
  }

  async render(appointment, practitioner, local, status) {
    const reference = appointment.participant?.find((p) => p.actor?.reference?.startsWith('Patient/'))?.actor?.reference;
    let patient = null;
    try { patient = reference ? await this.repo.readReference({ reference }) : null; } catch { patient = null; }
    const internal = patient?.identifier?.find((i) => i.system === this.settings.patient_system)?.value
      ?? `Z${appointment.id.length}${appointment.id.replace(/[^0-9]/g, '')}9999`;   // an id no Patient carries
    const csn = appointment.identifier?.find((i) => String(i.type?.text ?? '').toUpperCase() === 'CSN')?.value ?? appointment.id;
    const minutes = appointment.minutesDuration
      ?? Math.round((new Date(appointment.end ?? appointment.start) - new Date(appointment.start)) / 60000);
    const location = appointment.participant?.find((p) => p.actor?.reference?.startsWith('Location/'))?.actor?.display ?? '';
    const external = practitioner.identifier?.find((i) => String(i.type?.text ?? '').toUpperCase() === 'EXTERNAL'
      || (this.settings.provider_system && i.system === this.settings.provider_system))?.value;
    return {
      AppointmentDuration: appointment.id in this.settings.durations ? this.settings.durations[appointment.id] : String(minutes),
      AppointmentNotes: appointment.comment ? [appointment.comment] : [],
      AppointmentStartTime: local.time,
      AppointmentStatus: status,
      ContactIDs: [{ ID: csn, Type: 'CSN' }, { ID: `8${csn.length}${csn.replace(/[^0-9]/g, '')}`, Type: 'ASN' }],
      Date: local.date,
      ExtraExtensions: [],
      ExtraItems: [],
      PatientIDs: [{ ID: internal.padStart(10, ' '), Type: 'Internal' }, { ID: `EK${internal}`, Type: 'ExternalKey' },
        ...(this.settings.fhir_patient_ids && patient ? [{ ID: patient.id, Type: 'FHIR' }] : [])],
      PatientName: patient ? upperName(patient, ',') : '',
      Providers: [{ DepartmentIDs: [{ ID: '101', Type: 'Internal' }], DepartmentName: location, Duration: String(minutes),
        ProviderIDs: [{ ID: '   E1000', Type: 'Internal' }, ...(external ? [{ ID: external, Type: 'External' }] : [])],
        ProviderName: upperName(practitioner, ', '), Time: local.time }],
      VisitTypeIDs: [{ ID: appointment.appointmentType?.coding?.[0]?.code ?? '1001', Type: 'Internal' }],
      VisitTypeName: text(appointment.appointmentType),
    };
  }
}
