// A real OpenID Connect provider (oidc-provider, OpenID Certified) on 127.0.0.1 for the
// sign-in tests: one client, a few people, the provider's own development sign-in and
// consent pages. It prints its issuer URL on the first line of stdout.
//
// The client is "native", so any loopback port of http://127.0.0.1/auth/callback is an
// allowed redirect URI (RFC 8252, 7.3): the control plane under test binds port 0.

import { createServer } from 'node:http';
import Provider from 'oidc-provider';

const people = {
  alice: { sub: 'alice', email: 'alice@example.com', name: 'Alice', groups: ['ml-team'] },
  root: { sub: 'root', email: 'root@example.com', name: 'Root', groups: ['ops'] },
  mallory: { sub: 'mallory', email: 'mallory@example.com', name: 'Mallory', groups: [] },
  audrey: { sub: 'audrey', email: 'audrey@example.com', name: 'Audrey', groups: ['auditors'] },
};

const server = createServer();
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  const issuer = `http://127.0.0.1:${port}`;
  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: 'allot',
        client_secret: 'allot-test-secret',
        application_type: 'native',
        redirect_uris: ['http://127.0.0.1/auth/callback'],
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: 'client_secret_basic',
      },
      // What the CLI or automation would sign in as: its access tokens are opaque, and
      // Allot checks them by introspection (as the `allot` client).
      ...['allot-cli', 'other-app'].map((id) => ({
        client_id: id,
        client_secret: `${id}-secret`,
        application_type: 'native',
        redirect_uris: [`http://127.0.0.1/${id}/callback`],
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: 'client_secret_basic',
      })),
    ],
    claims: { openid: ['sub'], email: ['email'], profile: ['name', 'groups'] },
    // Claims in the ID token itself, not only from the userinfo endpoint.
    conformIdTokenClaims: false,
    findAccount: (_ctx, id) =>
      people[id] && { accountId: id, claims: () => people[id] },
    pkce: { required: () => true },
    cookies: { keys: ['allot-test-only'] },
    features: {
      devInteractions: { enabled: true },
      // RFC 7662, for confidential clients only.
      introspection: {
        enabled: true,
        allowedPolicy: async (_ctx, client) => client.clientAuthMethod !== 'none',
      },
    },
  });
  server.on('request', provider.callback());
  console.log(issuer);
});
