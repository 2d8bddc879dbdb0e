#!/usr/bin/env bash
# Every shell script of the tree (tests, scripts, job scripts, benches) can fail when it
# should. Under `set -e` two constructs never stop a script:
#   ! cmd            a negated command (bash ignores errexit for it)
#   test && cmd      a non-final member of an && list (its failure is not an error)
# so an assertion written that way checks nothing. The grep below refuses both outside
# if/while conditions and ||-guarded lines; then shellcheck (Debian's package) reads every
# script for the rest (SC2251 is the first construct). Without shellcheck the test reports
# itself skipped (77) after the grep has passed.
# Env: SRC = the source tree.
set -euo pipefail
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$SRC"
mapfile -t scripts < <(git ls-files '*.sh' '*.sbatch' '*.qsub' 2>/dev/null ||
                       find . \( -name '*.sh' -o -name '*.sbatch' -o -name '*.qsub' \) -not -path './build*')
[ ${#scripts[@]} -ge 20 ] || { echo "FAIL: found only ${#scripts[@]} shell scripts under $SRC"; exit 1; }

# Quoted text, $(...) and <(...) are dropped first (a && there is a subshell's); then a
# statement (at the line's start or after ;, do, then, else) that is `! cmd`, or whose
# && list has a non-final member, with no || on the line to catch the failure. Lines that
# are an if/while/until condition or a comment are not statements.
statement='(.*(;|[[:space:]]do|[[:space:]]then|[[:space:]]else))?[[:space:]]*'
bad=$(grep -nE '&&|!' "${scripts[@]}" |
      sed -E "s/'[^']*'//g; s/\\$\([^)]*\)//g; s/<\([^)]*\)//g; s/\"[^\"]*\"//g" |
      grep -E "^[^:]*:[0-9]+:$statement(![[:space:]]|[^[:space:]=()\$]+[[:space:]].*&&)" |
      grep -vE '\|\||^[^:]*:[0-9]+:[[:space:]]*(if|elif|while|until|#)[[:space:]]|(then|do|\\)[[:space:]]*(#.*)?$' || true)
if [ -n "$bad" ]; then
  echo "FAIL: these lines never fail under set -e (use if ...; then ...; fi, or || die):"
  echo "$bad"
  exit 1
fi
echo "grep: no negated statement and no test as a non-final && member in ${#scripts[@]} scripts"

if ! command -v shellcheck >/dev/null; then
  echo "SKIP: shellcheck is not installed (Debian: apt-get install shellcheck); the grep check passed"
  exit 77
fi
# SC1091: sourced files are followed with -x from each script's folder instead.
shellcheck -x -P SCRIPTDIR -S info -e SC1091 "${scripts[@]}"
echo "shellcheck: ${#scripts[@]} scripts clean"
