"""FHIR Bulk Data Access 2.0 export for backend apps: Groups, kick-off parameters, jobs, their files (docs/bulk-data.md)."""
