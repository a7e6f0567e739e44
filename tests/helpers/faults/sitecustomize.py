"""Fault injection for a child `svc-auth` process under test (`helpers.processes.faulty_env`).

Python imports this module at start-up when its folder is on `PYTHONPATH`. With
`SVC_TEST_FAULT_ORGANIZATION` set to an organization id, that organization's FHIR connector raises
`RuntimeError` where it looks up a practitioner: an exception no code path expects, standing for a
defect not yet found, so a test can show that one clinic's defect costs the others nothing. The
code under test (the night's isolation) runs unchanged; without the variable this module does
nothing."""
import os

_ORGANIZATION = os.environ.get("SVC_TEST_FAULT_ORGANIZATION")

if _ORGANIZATION:
    from connectors.fhir.connector import FhirConnector

    _practitioner_id = FhirConnector.practitioner_id

    def _faulty_practitioner_id(self, npi):
        if self.organization.id == _ORGANIZATION:
            raise RuntimeError(f"injected fault for {_ORGANIZATION}")
        return _practitioner_id(self, npi)

    FhirConnector.practitioner_id = _faulty_practitioner_id
