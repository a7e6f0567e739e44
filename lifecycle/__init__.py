"""Platform-side business rules: launches, the platform verifying a token, activation, billing."""
