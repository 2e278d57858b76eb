#!/bin/bash
# Regenerate the golden files from the real bpftrace (v0.17.0, run as root):
#   crates/output/tests/golden/regen-from-bpftrace.sh [name...]
# Each NAME.bt is run as `bpftrace [flags] NAME.bt`, where flags come from a first line
# `// flags: ...`; its stdout becomes NAME.out. A `// ties:` line marks programs whose
# output has ties bpftrace orders at random (hash order): the script reruns them until
# the output matches the committed golden (weft's deterministic tie order), up to 50
# times, and reports when it never does.
set -u
cd "$(dirname "$0")"
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=()
  for f in *.bt; do names+=("${f%.bt}"); done
fi
for n in "${names[@]}"; do
  flags=$(sed -n '1s|^// flags: ||p' "$n.bt")
  if grep -q '^// ties:' "$n.bt" && [ -f "$n.out" ]; then
    ok=0
    for _ in $(seq 50); do
      # shellcheck disable=SC2086
      bpftrace $flags "$n.bt" >"$n.tmp" 2>/dev/null
      if cmp -s "$n.tmp" "$n.out"; then ok=1; break; fi
    done
    rm -f "$n.tmp"
    [ $ok = 1 ] && echo "$n: matches" || echo "$n: bpftrace never produced the committed order"
  else
    # shellcheck disable=SC2086
    bpftrace $flags "$n.bt" >"$n.out" 2>/dev/null
    echo "$n: $(wc -c <"$n.out") bytes"
  fi
done
