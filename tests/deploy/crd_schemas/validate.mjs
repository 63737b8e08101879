// Validate prometheus-operator custom resources (JSON documents, one array on stdin) against the CRDs'
// schemas, as compiled by @kubernetes-models/prometheus-operator.  Prints one JSON line per document:
// {"kind", "name", "errors": [...]}; exit 0 even with errors (the test reads them), 2 on an unknown kind.
import { readFileSync } from "node:fs";
import * as v1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const docs = JSON.parse(readFileSync(0, "utf8"));
let status = 0;
for (const doc of docs) {
  const [group, version] = doc.apiVersion.split("/");
  const Model = group === "monitoring.coreos.com" && version === "v1" ? v1[doc.kind] : undefined;
  const name = doc.metadata && doc.metadata.name;
  if (!Model) {
    console.log(JSON.stringify({ kind: doc.kind, name, errors: [`no schema for ${doc.apiVersion} ${doc.kind}`] }));
    status = 2;
    continue;
  }
  let errors = [];
  try {
    new Model(doc).validate();
  } catch (e) {
    errors = (e.errors || [e]).map((x) => x.instancePath !== undefined ? `${x.instancePath} ${x.message}` : String(x.message || x));
  }
  console.log(JSON.stringify({ kind: doc.kind, name, errors }));
}
process.exit(status);
