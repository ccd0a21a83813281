#!/usr/bin/env bash
# Trials of `rankmesh doctor` at default settings on a fake cluster of 4
# netns nodes, 1 rank each (scripts/fake-nodes.sh, RANKMESH_FAKE_NET=1):
# HEALTHY runs of a healthy cluster, then SLOW runs with node 2 behind a tbf
# at half the healthy link rate (measured from the healthy runs' median
# link), then SLOW runs with node 2 at 50mbit. Prints how many runs ended as
# they should (healthy: exit 0, no finding; slow: exit non-zero, node 2 the
# one finding) and each run's wall time.
# Usage: scripts/doctor-trials.sh [HEALTHY=20] [SLOW=10]   (needs root)
set -euo pipefail
cd "$(dirname "$0")/.."
healthy="${1:-20}" slow="${2:-10}"
bin=target/release/rankmesh
cargo build --release --quiet
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() { # SLOW-SPEC JSON -> stdout of the run; rc in $tmp/rc, seconds in $tmp/s
  local start end
  start=$(date +%s.%N)
  set +e
  RANKMESH_FAKE_NET=1 RANKMESH_FAKE_SLOW="$1" scripts/fake-nodes.sh 4 1 "$bin" doctor -J "$2" \
    >"$tmp/out" 2>&1
  echo $? >"$tmp/rc"
  set -e
  end=$(date +%s.%N)
  echo "$end - $start" | bc >"$tmp/s"
}
# The report's finding lines: those after "verdict", up to the first that is
# not indented (stderr follows, with mpirun's own indented lines).
findings() { awk '/^verdict/ {on = 1; next} on && /^  / {print; next} on {exit}' "$tmp/out"; }
good=0 links=()
for ((i = 1; i <= healthy; i++)); do
  run "" "$tmp/h.json"
  n=$(findings | wc -l)
  if [[ $(cat "$tmp/rc") == 0 && $n == 0 ]]; then good=$((good + 1)); else findings; fi
  links+=("$(python3 -c "import json,statistics as s; print(s.median(p['bandwidth_gbs'] for p in json.load(open('$tmp/h.json'))['measurements']['inter_node']))")")
  echo "healthy $i: rc $(cat "$tmp/rc"), $n finding(s), $(cat "$tmp/s") s, median link ${links[-1]} GB/s"
done
echo "healthy: $good of $healthy exit 0 with no finding"
med=$(printf '%s\n' "${links[@]}" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
half=$(python3 -c "print(int($med * 8e3 / 2))")mbit
for rate in "$half" 50mbit; do
  good=0
  for ((i = 1; i <= slow; i++)); do
    run "2:$rate" "$tmp/s.json"
    f=$(findings)
    if [[ $(cat "$tmp/rc") != 0 && $(echo "$f" | wc -l) == 1 && $f == *"node 2 (rankmesh-node2)"* ]]; then
      good=$((good + 1))
    fi
    echo "node 2 at $rate, run $i: rc $(cat "$tmp/rc"), $(cat "$tmp/s") s: ${f:-no finding}"
  done
  echo "node 2 at $rate (healthy median link $med GB/s): $good of $slow exit non-zero naming node 2 alone"
done
