// The bench's peer (issue 37): node-oidc-provider 9 as a user deploys it for machine clients:
// its documented Adapter interface over PostgreSQL (`pg`, one pool per process), the client kept in
// the database (as registered clients are), `client_credentials` with client_secret_basic, and
// RS256-signed JWT access tokens (resourceIndicators with a default resource whose
// accessTokenFormat is 'jwt'). `--processes N` runs N workers under node:cluster (the same shape
// as `svc-auth serve --processes N`); the primary only forks.
//
// `--clients-in-config` (issue 49) starts it as its own documentation does: the client in the
// Provider's `clients` configuration, its default in-memory adapter, one Node process, nothing read
// from a database per token (no --database-url).
//
//   node oidc_peer.mjs --port P (--database-url postgresql://... | --clients-in-config) --client-id ID --client-secret S [--processes N]
// prints "ready <issuer>" once every worker listens.
import cluster from 'node:cluster';
import crypto from 'node:crypto';

const args = process.argv.slice(2);
const arg = (name, fallback) => (args.includes(name) ? args[args.indexOf(name) + 1] : fallback);
const port = Number(arg('--port'));
const databaseUrl = arg('--database-url');
const clientId = arg('--client-id');
const clientSecret = arg('--client-secret');
const clientsInConfig = args.includes('--clients-in-config');
const processes = clientsInConfig ? 1 : Number(arg('--processes', '1'));
const issuer = `http://127.0.0.1:${port}`;
const RESOURCE = 'https://api.bench.example';

const { default: pg } = await import('pg');

const SCHEMA = `CREATE TABLE IF NOT EXISTS oidc_payloads (
  id text NOT NULL, type text NOT NULL, payload jsonb NOT NULL, grant_id text, user_code text, uid text,
  expires_at timestamptz, PRIMARY KEY (id, type));
  CREATE INDEX IF NOT EXISTS oidc_payloads_grant_id ON oidc_payloads (grant_id);
  CREATE INDEX IF NOT EXISTS oidc_payloads_user_code ON oidc_payloads (user_code);
  CREATE INDEX IF NOT EXISTS oidc_payloads_uid ON oidc_payloads (uid);`;

const registeredClient = { client_id: clientId, client_secret: clientSecret, grant_types: ['client_credentials'],
  redirect_uris: [], response_types: [], token_endpoint_auth_method: 'client_secret_basic' };

if (cluster.isPrimary && !clientsInConfig) {
  // Once: the schema, the registered client and the signing key every worker shares.
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 });
  await pool.query(SCHEMA);
  await pool.query(`INSERT INTO oidc_payloads (id, type, payload) VALUES ($1, 'Client', $2)
    ON CONFLICT (id, type) DO UPDATE SET payload = EXCLUDED.payload`, [clientId, registeredClient]);
  await pool.end();
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = { ...privateKey.export({ format: 'jwk' }), kid: 'bench', use: 'sig', alg: 'RS256' };
  let ready = 0;
  for (let i = 0; i < processes; i += 1) {
    cluster.fork({ OIDC_PEER_JWK: JSON.stringify(jwk) }).on('message', (message) => {
      if (message === 'listening' && (ready += 1) === processes) console.log(`ready ${issuer}`);
    });
  }
  const stop = () => { for (const worker of Object.values(cluster.workers)) worker.kill('SIGTERM'); };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
} else {
  const { default: Provider } = await import('oidc-provider');
  // Idle connections are kept (svc-auth's pool keeps its own): none is reopened between rounds.
  const pool = clientsInConfig ? null : new pg.Pool({ connectionString: databaseUrl, max: 10, idleTimeoutMillis: 0 });

  // node-oidc-provider's Adapter interface (lib/adapters/memory_adapter.js is its reference),
  // one row per model instance.
  class PostgresAdapter {
    constructor(name) { this.name = name; }

    async upsert(id, payload, expiresIn) {
      await pool.query(`INSERT INTO oidc_payloads (id, type, payload, grant_id, user_code, uid, expires_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id, type) DO UPDATE SET payload = EXCLUDED.payload,
        grant_id = EXCLUDED.grant_id, user_code = EXCLUDED.user_code, uid = EXCLUDED.uid,
        expires_at = EXCLUDED.expires_at`,
      [id, this.name, payload, payload.grantId ?? null, payload.userCode ?? null, payload.uid ?? null,
        expiresIn ? new Date(Date.now() + expiresIn * 1000) : null]);
    }

    async #findBy(column, value) {
      const { rows } = await pool.query(`SELECT payload FROM oidc_payloads WHERE ${column} = $1 AND type = $2
        AND (expires_at IS NULL OR expires_at > now())`, [value, this.name]);
      return rows[0]?.payload;
    }

    find(id) { return this.#findBy('id', id); }

    findByUserCode(userCode) { return this.#findBy('user_code', userCode); }

    findByUid(uid) { return this.#findBy('uid', uid); }

    async consume(id) {
      await pool.query(`UPDATE oidc_payloads SET payload = payload || jsonb_build_object('consumed', extract(epoch from now())::int)
        WHERE id = $1 AND type = $2`, [id, this.name]);
    }

    async destroy(id) { await pool.query('DELETE FROM oidc_payloads WHERE id = $1 AND type = $2', [id, this.name]); }

    async revokeByGrantId(grantId) {
      await pool.query('DELETE FROM oidc_payloads WHERE grant_id = $1 AND type = $2', [grantId, this.name]);
    }
  }

  const jwk = clientsInConfig ? { ...crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey
    .export({ format: 'jwk' }), kid: 'bench', use: 'sig', alg: 'RS256' } : JSON.parse(process.env.OIDC_PEER_JWK);
  const provider = new Provider(issuer, {
    ...(clientsInConfig ? { clients: [registeredClient] } : { adapter: PostgresAdapter }),
    jwks: { keys: [jwk] },
    clientAuthMethods: ['client_secret_basic'],
    scopes: ['api'],
    features: {
      clientCredentials: { enabled: true },
      devInteractions: { enabled: false },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => RESOURCE,
        useGrantedResource: () => true,
        getResourceServerInfo: () => ({ scope: 'api', audience: RESOURCE, accessTokenTTL: 3600,
          accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } } }),
      },
    },
  });
  provider.proxy = false;
  provider.on('server_error', (ctx, err) => console.log(`server_error: ${err.message}`));
  provider.listen(port, '127.0.0.1', () => (clientsInConfig ? console.log(`ready ${issuer}`) : process.send('listening')));
  process.on('SIGTERM', () => process.exit(0));
}
