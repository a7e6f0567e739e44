"""The HL7v2 SIU feed: clinics' EHRs push their schedules to `svc-auth hl7 listen` (docs/hl7-feed.md).

- `mllp`: MLLP framing (0x0B message 0x1C 0x0D), incremental and bounded (1 MiB).
- `message`: HL7v2 ER7 parsing (segments, fields, components, escapes) and DTM times.
- `siu`: what an SIU^S12-S26 message says about one appointment (CONTRACTS.md's rules).
- `ack`: the original-mode acknowledgment (MSA `AA`/`AE`/`AR`, ERR saying why).
- `store`: applying a message in one transaction, duplicates and MSH-7 order; retention.
- `listener`: the TCP (optionally TLS) server, one process per `hl7 listen`.
- `slots`: its connection caps: in all, per peer (an IPv4 address, an IPv6 /64), and half for senders
  never proven.
- `config`: a clinic's feed settings (`orgs create|update --schedule-source --hl7-facility --hl7-allow
  --hl7-client-subject`).
- `source`: the night's schedule source that reads the feed's appointments.
"""
