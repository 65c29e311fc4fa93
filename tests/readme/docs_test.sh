#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# readme.docs: the documentation's own checks.
#  - README.md's first screen (up to "## Integrate in 5 minutes") is at most
#    60 lines: what kdn is, the two commands, the demo's output, the figures;
#  - every relative link of README.md, docs/*.md and the bindings' READMEs
#    names a file that exists;
#  - docs/architecture.svg is what Graphviz makes of docs/architecture.dot
#    (when dot is installed; scripts/setup installs it).
#   docs_test.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 1
fail=0
bad() { echo "FAIL: $*"; fail=1; }

first=$(grep -n '^## Integrate in 5 minutes' README.md | head -1 | cut -d: -f1)
[ -n "$first" ] || bad "README.md has no '## Integrate in 5 minutes'"
[ -n "$first" ] && [ "$first" -gt 61 ] && bad "README.md's first screen is $((first - 1)) lines (at most 60)"

for f in README.md docs/*.md bindings/*/README.md; do
  dir=$(dirname "$f")
  # ](target) links, without #anchors and outside code spans; http(s) and mailto left out.
  while IFS= read -r target; do
    path=${target%%#*}
    [ -z "$path" ] && continue
    case $path in http://* | https://* | mailto:*) continue ;; esac
    [ -e "$dir/$path" ] || bad "$f links to $target, which does not exist"
  done < <(grep -o '](\([^)]*\))' "$f" | sed 's/^](\(.*\))$/\1/')
done

if command -v dot > /dev/null; then
  made=$(mktemp)
  dot -Tsvg docs/architecture.dot -o "$made" || bad "dot failed on docs/architecture.dot"
  cmp -s "$made" docs/architecture.svg ||
    bad "docs/architecture.svg is not current: dot -Tsvg docs/architecture.dot -o docs/architecture.svg"
  rm -f "$made"
else
  echo "dot (graphviz) is not installed: the picture is not checked"
fi
[ "$fail" = 0 ] && echo "passed"
exit "$fail"
