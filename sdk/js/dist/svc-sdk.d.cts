/** TypeScript declarations of the svc-auth JS SDK (`@svc-auth/sdk`); see docs/hub-and-sdk.md. */

export interface SvcSdkOptions {
  /** The app token endpoint; default: the manifest's token endpoint, which the hub tells the SDK. */
  tokenEndpoint?: string;
  /** Same as `tokenEndpoint`. */
  appTokenEndpoint?: string;
  /** Skip the code exchange (the identity-provider variant). */
  accessToken?: string;
  /** With `accessToken`: the ID token `getIdToken()` returns; default: the ID token the service issued with that access token, which the platform returns when it verifies it. */
  idToken?: string | null;
  /** The hub's origin; default: the origin the SDK script was loaded from, else the embedding page's. */
  platformOrigin?: string;
  /** How long to wait for the hub's answers, in milliseconds (default 15000). */
  timeoutMs?: number;
  /** The clinic's FHIR base for `instance.fhir`; default: `iss`, else `{platform origin}/fhir/r4/{organization}`. */
  fhirBaseUrl?: string;
  /** The SMART launch's `iss` (the clinic's FHIR base); used when `fhirBaseUrl` is not given. */
  iss?: string;
  /** The clinic (`svc_organization_id` of the launch); default: the `org` of the access token. */
  svcOrganizationId?: string;
}

/** A FHIR R4 resource or Bundle as JSON. */
export interface FhirResource {
  resourceType: string;
  id?: string;
  [field: string]: unknown;
}

/** The platform FHIR API with the instance's access token; rejections are SvcSdkErrors whose `body` is the OperationOutcome. */
export interface SvcFhirClient {
  /** The clinic's FHIR base (null when unknown: calls then reject with `no_fhir_base`). */
  baseUrl: string | null;
  /** `GET {base}/{type}/{id}`. */
  read(resourceType: string, id: string): Promise<FhirResource>;
  /** `GET {base}/{type}?params`: a searchset Bundle. An array value repeats the parameter. */
  search(resourceType: string,
         params?: Record<string, string | number | Array<string | number>> | URLSearchParams): Promise<FhirResource>;
}

export interface SessionContext {
  /** Always a string: an initialization without an ID token rejects with SvcSdkError `no_id_token`. */
  getIdToken(): Promise<{ idToken: string }>;
}

/** What `initializeSvcSDK` / `loadSdk` resolve with once the platform verified the access token. */
export interface SvcPlatformInstance {
  platformOrigin: string;
  sessionContext: SessionContext;
  /** The clinic's FHIR R4 API, called with the instance's access token. */
  fhir: SvcFhirClient;
}

/** A rejection: `code` is e.g. "forbidden", "trial_expired", "not_embedded", "platform_timeout", "no_id_token". */
export interface SvcSdkError extends Error {
  name: "SvcSdkError";
  code: string;
  status: number | null;
  body: unknown;
}

/** Makes an SvcSdkError (a plain `Error` with the fields above; call it without `new`). */
export declare function SvcSdkError(code: string, message: string, status?: number | null,
                                    body?: unknown): SvcSdkError;

export declare function initializeSvcSDK(options?: SvcSdkOptions): Promise<SvcPlatformInstance>;

/** The same as `initializeSvcSDK`. */
export declare function loadSdk(options?: SvcSdkOptions): Promise<SvcPlatformInstance>;

export interface SvcSdk {
  initializeSvcSDK: typeof initializeSvcSDK;
  loadSdk: typeof loadSdk;
  SvcSdkError: typeof SvcSdkError;
}

/** An SDK bound to another window-like object (tests, other frames). */
export declare function createSdk(global: object): SvcSdk;

declare const sdk: SvcSdk;
export default sdk;

declare global {
  interface Window {
    /** Set by the script-tag build (/static/sdk/svc-sdk.js). */
    svcSdk: SvcSdk;
    loadSdk: typeof loadSdk;
  }
}
