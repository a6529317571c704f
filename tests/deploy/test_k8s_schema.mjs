#!/usr/bin/env node
// test_k8s_schema -- every Kubernetes manifest we ship, validated against the Kubernetes schema,
// offline and strict on unknown fields (what `kubeconform -strict` does, without its downloads).
//
// Owns the schema check only; what the objects mean and how they refer to each other is
// tests/deploy/test_deploy_manifests.py's. Data flow:
//   deploy/k8s/*.yaml --yaml (YAML 1.1, as Kubernetes' sigs.k8s.io/yaml reads it)--> one JS object
//   per document --apiVersion/kind (GA versions only, see modelFor)--> the model class of npm
//   `kubernetes-models` (Kubernetes v1.36.0 OpenAPI spec) or
//   `@kubernetes-models/prometheus-operator` (monitoring.coreos.com types of prometheus-operator
//   v0.91.0) --> its ajv validator, compiled by those packages from the upstream schemas: types,
//   required fields, enums, formats.
// Unknown fields: the official OpenAPI spec does not say `additionalProperties: false`, so the
// compiled validators accept any extra key (a typo such as `livenesProbe` passes). The validator is
// therefore handed the document wrapped in Proxies that record every key it looks up; a key of an
// object the validator walked but never looked up is a field the schema does not declare, reported
// as "unknown field" (the API server's fieldValidation=Strict rejects those too). Maps (labels,
// ConfigMap data, resources) are enumerated by the validator, so their keys count as looked up. An
// object the validator never walked is either under an error already reported or declared by the
// schema as free-form; those are listed as "not checked field by field", never silently passed.
// Self-checks run first on small documents with a known typo, a wrong type and a missing required
// field, so a validator update that changed how it reads objects fails here instead of letting
// typos through.
//
// Run: node tests/deploy/test_k8s_schema.mjs (CTest: script.test_k8s_schema). One PASS/FAIL line
// per check, errors as `file doc N Kind/name: /json/path: message`, then "N passed, N failed".
// Exit 1 when one failed, 77 (skipped) when the npm packages are not installed
// (deploy/install-deps.sh runs `npm ci` in tests/deploy).
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = join(HERE, "..", "..");
const K8S_DIR = join(ROOT, "deploy", "k8s");
const K8S_VERSION = "v1.36.0"; // kubernetes-models 5.x: "Update to Kubernetes v1.36.0"

let YAML;
try {
  YAML = await import("yaml");
  await import("kubernetes-models/v1");
  await import("@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1");
} catch (err) {
  console.log(`SKIP test_k8s_schema: npm packages not installed in tests/deploy (${err.code || err.message}); ` +
              "run deploy/install-deps.sh (npm ci --prefix tests/deploy)");
  process.exit(77);
}

// apiVersion -> the module holding its model classes. Core is "v1"; every other group is
// "group/version" in both packages.
function modelModule(apiVersion) {
  if (apiVersion.startsWith("monitoring.coreos.com/"))
    return `@kubernetes-models/prometheus-operator/${apiVersion}`;
  return `kubernetes-models/${apiVersion}`;
}

// kubernetes-models merges the OpenAPI specs of several releases, the latest (v1.36.0) last and
// winning for every definition it has, so that API versions removed since (policy/v1beta1, ...)
// keep their old schemas. Every removed version was alpha or beta (the deprecation policy never
// removes a GA version), so accepting GA versions only is what pins the check to v1.36.0; it is
// also what a manifest meant for any cluster should use (beta APIs are off by default since 1.24).
async function modelFor(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string")
    return { error: "apiVersion and kind must be strings" };
  if (/(alpha|beta)\d*$/.test(apiVersion))
    return { error: `${apiVersion} is not a GA API version (removed from, or off by default in, ` +
                    `Kubernetes ${K8S_VERSION}; use the GA version of ${kind})` };
  let mod;
  try {
    mod = await import(modelModule(apiVersion));
  } catch {
    return { error: `no schema for apiVersion ${apiVersion} (Kubernetes ${K8S_VERSION})` };
  }
  const model = mod[kind];
  if (typeof model !== "function" || model.apiVersion !== apiVersion || model.kind !== kind)
    return { error: `no schema for kind ${kind} in ${apiVersion} (Kubernetes ${K8S_VERSION})` };
  return { model };
}

// Wraps value so that every key the validator reads is recorded in reads (target -> Set of keys).
// One Proxy per target, so the validator sees stable identities.
function tracked(value, reads, proxies) {
  if (value === null || typeof value !== "object") return value;
  if (proxies.has(value)) return proxies.get(value);
  const note = (target, key) => {
    if (typeof key !== "string") return;
    if (!reads.has(target)) reads.set(target, new Set());
    reads.get(target).add(key);
  };
  const proxy = new Proxy(value, {
    get(target, key, receiver) {
      note(target, key);
      return tracked(Reflect.get(target, key, receiver), reads, proxies);
    },
    has(target, key) {
      note(target, key);
      return Reflect.has(target, key);
    },
    getOwnPropertyDescriptor(target, key) {
      note(target, key);
      return Reflect.getOwnPropertyDescriptor(target, key);
    },
  });
  proxies.set(value, proxy);
  return proxy;
}

// Keys the validator never read, in objects it walked; free-form objects it never walked.
function unreadFields(value, path, reads, out) {
  if (Array.isArray(value)) {
    value.forEach((item, i) => unreadFields(item, `${path}/${i}`, reads, out));
    return;
  }
  if (value === null || typeof value !== "object") return;
  const seen = reads.get(value);
  if (!seen) {
    if (Object.keys(value).length > 0) out.unchecked.push(path || "/");
    return;
  }
  for (const key of Object.keys(value)) {
    const child = `${path}/${key.replace(/~/g, "~0").replace(/\//g, "~1")}`;
    if (seen.has(key)) unreadFields(value[key], child, reads, out);
    else out.errors.push({ path: child, message: `unknown field "${key}"` });
  }
}

// Validates one parsed document: returns {errors: [{path, message}], unchecked: [path]}.
async function validateDoc(doc) {
  if (doc === null || typeof doc !== "object" || Array.isArray(doc))
    return { errors: [{ path: "", message: "a manifest document must be a mapping" }], unchecked: [] };
  const { model, error } = await modelFor(doc.apiVersion, doc.kind);
  if (error) return { errors: [{ path: "", message: error }], unchecked: [] };
  const reads = new Map();
  const out = { errors: [], unchecked: [] };
  try {
    // The model's validate() runs the package's compiled validator on `this`; calling it on the
    // Proxy (not `new model(doc)`, which copies every field) is what lets the reads be recorded.
    model.prototype.validate.call(tracked(doc, reads, new WeakMap()));
  } catch (err) {
    if (!Array.isArray(err.errors)) throw err;
    for (const e of err.errors) {
      let msg = e.message;
      if (e.keyword === "enum") msg += `: ${JSON.stringify(e.params.allowedValues)}`;
      out.errors.push({ path: e.instancePath, message: msg });
    }
  }
  unreadFields(doc, "", reads, out);
  return out;
}

function describe(doc) {
  const kind = doc && typeof doc === "object" ? doc.kind : undefined;
  const name = doc && doc.metadata ? doc.metadata.name : undefined;
  return `${kind ?? "?"}/${name ?? "?"}`;
}

let passed = 0;
let failed = 0;
function report(ok, label, lines = []) {
  console.log(`${ok ? "PASS" : "FAIL"} ${label}`);
  for (const line of lines) console.log(`  ${line}`);
  ok ? passed++ : failed++;
}

// Self-checks: each bad document must be rejected with exactly the expected JSON path.
const pod = (containers) => ({
  apiVersion: "apps/v1",
  kind: "Deployment",
  metadata: { name: "selfcheck", labels: { app: "x" } },
  spec: {
    replicas: 1,
    selector: { matchLabels: { app: "x" } },
    template: { metadata: { labels: { app: "x" } }, spec: { containers } },
  },
});
const goodContainer = () => ({
  name: "c",
  image: "example.org/c:1",
  resources: { requests: { cpu: "1", memory: "64Mi" } },
  livenessProbe: { httpGet: { path: "/livez", port: "http" } },
});
const SELF_CHECKS = [
  { what: "a valid Deployment passes", doc: pod([goodContainer()]), expect: [] },
  {
    what: "a typo in a field name is an unknown field",
    doc: pod([{ ...goodContainer(), livenesProbe: { httpGet: { path: "/livez", port: 80 } } }]),
    expect: ["/spec/template/spec/containers/0/livenesProbe"],
  },
  {
    what: "a wrong type is rejected",
    doc: { ...pod([goodContainer()]), spec: { ...pod([goodContainer()]).spec, replicas: "1" } },
    expect: ["/spec/replicas"],
  },
  {
    what: "a missing required field is rejected",
    doc: pod([{ image: "example.org/c:1" }]),
    expect: ["/spec/template/spec/containers/0"],
  },
  {
    what: "an enum value outside the schema is rejected",
    doc: pod([{ ...goodContainer(), imagePullPolicy: "Sometimes" }]),
    expect: ["/spec/template/spec/containers/0/imagePullPolicy"],
  },
  {
    what: "an unknown field in a ServiceMonitor (CRD schema) is rejected",
    doc: {
      apiVersion: "monitoring.coreos.com/v1",
      kind: "ServiceMonitor",
      metadata: { name: "selfcheck" },
      spec: { selector: { matchLabels: { app: "x" } }, endpoints: [{ port: "admin", bearerToken: "x" }] },
    },
    expect: ["/spec/endpoints/0/bearerToken"],
  },
  {
    what: "a removed (beta) API version is rejected",
    doc: { ...pod([goodContainer()]), apiVersion: "extensions/v1beta1" },
    expect: [""],
  },
  {
    what: "an apiVersion/kind without a schema is an error, not a pass",
    doc: { apiVersion: "example.com/v1", kind: "Widget", metadata: { name: "w" } },
    expect: [""],
  },
];
for (const check of SELF_CHECKS) {
  const { errors } = await validateDoc(check.doc);
  const paths = [...new Set(errors.map((e) => e.path))].sort();
  const ok = JSON.stringify(paths) === JSON.stringify([...check.expect].sort());
  report(ok, `self-check: ${check.what}`,
         ok ? [] : [`expected errors at ${JSON.stringify(check.expect)}, got:`,
                    ...errors.map((e) => `${e.path || "/"}: ${e.message}`)]);
}

// The manifests.
const files = readdirSync(K8S_DIR).filter((f) => /\.ya?ml$/.test(f)).sort();
report(files.length > 0, `deploy/k8s has manifests (${files.join(", ")})`);
for (const file of files) {
  const rel = relative(ROOT, join(K8S_DIR, file));
  const docs = YAML.parseAllDocuments(readFileSync(join(K8S_DIR, file), "utf8"), { version: "1.1" });
  let index = 0;
  for (const ydoc of docs) {
    index++;
    const label = `${rel} doc ${index}`;
    if (ydoc.errors.length > 0) {
      report(false, `${label}: YAML`, ydoc.errors.map((e) => e.message));
      continue;
    }
    const doc = ydoc.toJS({ maxAliasCount: 100 });
    if (doc === null || doc === undefined) continue; // an empty document (comments only)
    const { errors, unchecked } = await validateDoc(doc);
    report(errors.length === 0, `${label} ${describe(doc)} (${doc.apiVersion})`,
           [...errors.map((e) => `${rel} doc ${index} ${describe(doc)}: ${e.path || "/"}: ${e.message}`),
            ...unchecked.map((p) => `note: ${p} is free-form in the schema, not checked field by field`)]);
  }
}

console.log(`test_k8s_schema (Kubernetes ${K8S_VERSION}): ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
