#!/usr/bin/env bash
# Lists the commits of a range whose subject breaks docs/CONTRIBUTING.md#commits: longer than 72
# characters, or not `area: summary` (area: the folder, lowercase; several joined by ", ").
#   scripts/check_commits.sh [RANGE]   default origin/main..HEAD (main..HEAD where there is no origin)
# Exits 1 when any commit breaks the rule. Merge commits are not checked. It is meant for new
# commits: the history before issue 36 breaks the rule, so do not run it over all of it.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly max_subject=72
readonly area_re='^[a-z0-9][a-z0-9_./+-]*(, [a-z0-9][a-z0-9_./+-]*)*: [^ ]'

default_range() {
  if git rev-parse --verify --quiet origin/main >/dev/null; then echo origin/main..HEAD; else echo main..HEAD; fi
}

# The reason a subject breaks the rule, or nothing when it keeps it.
subject_problem() {
  local subject=$1
  if ((${#subject} > max_subject)); then
    echo "${#subject} characters (at most $max_subject)"
  elif ! [[ $subject =~ $area_re ]]; then
    echo "not 'area: imperative summary'"
  fi
}

range=${1:-$(default_range)}
commits=$(git log --no-merges --format='%h%x09%s' "$range")  # fails, and so the script, on a bad range
bad=0
while IFS=$'\t' read -r hash subject; do
  [[ -n $hash ]] || continue
  problem=$(subject_problem "$subject")
  if [[ -n $problem ]]; then
    printf '%s  %s\n    %s\n' "$hash" "$subject" "$problem"
    bad=$((bad + 1))
  fi
done <<<"$commits"

if ((bad > 0)); then
  echo "$bad commit(s) in $range break the subject rule (docs/CONTRIBUTING.md#commits)" >&2
  exit 1
fi
