"""OAuth 2.0 / OpenID Connect rules, free of HTTP: grants, client authentication, claims, tokens."""
