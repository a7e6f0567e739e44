"""The disclosure audit: every response that carries patient data leaves one HMAC-chained record.

`audit.chain` appends and verifies (the chain's rules, one place); `audit.disclosures` is what
handlers and workers call (`disclosed`, `record`); `audit.accounting` answers an accounting of
disclosures (JSON, CSV, FHIR AuditEvents in IHE BALP shape). See docs/audit.md.
"""
