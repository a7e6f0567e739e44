"""Key material: RSA signing keys (`keys.signing`) and the server's HMAC key (`keys.secrets`)."""
