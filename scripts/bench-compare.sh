#!/usr/bin/env bash
# Compare the gateway's per-request and per-event costs of BASE (a commit) with the work tree,
# in one run, rounds interleaved (old, new, old, new, ...), on the same machine. Run nothing else
# heavy meanwhile. Usage: scripts/bench-compare.sh [BASE] [ROUNDS]; BENCHES (a -test.bench
# pattern) and BENCHTIME choose other benchmarks of ./gateway/ (BASE must have them); RAW=FILE
# also appends every round's benchmark lines there, side first (for metrics beyond the table's).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-f8755d9}
rounds=${2:-3}
benches=${BENCHES:-'^(BenchmarkRequest|BenchmarkRelayEvent)$'}
dir=$(mktemp -d)
trap 'git worktree remove --force "$dir/old" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
git worktree add --detach "$dir/old" "$base" >/dev/null 2>&1
(cd "$dir/old" && go test -c -o "$dir/old.test" ./gateway/)
go test -c -o "$dir/new.test" ./gateway/
for i in $(seq 1 "$rounds"); do
  for side in old new; do
    src=$([ "$side" = old ] && echo "$dir/old/gateway" || echo "$PWD/gateway")
    (cd "$src" && "$dir/$side.test" -test.run '^$' -test.bench "$benches" -test.benchmem -test.benchtime ${BENCHTIME:-2000x}) |
      awk '/^Benchmark/' | sed "s/^/$side /" | tee -a "${RAW:-/dev/null}" |
      awk '{print $1, $2, $4, $(NF-3), $(NF-1)}' >> "$dir/results"
  done
done
# name: median ns/op, B/op, allocs/op per side, then new/old.
awk '
{ key=$2; side=$1; n[side,key]++; ns[side,key,n[side,key]]=$3; b[side,key]=$4; a[side,key]=$5; keys[key]=1 }
function median(side,key,   i,j,t,m,arr) { m=n[side,key]; for(i=1;i<=m;i++) arr[i]=ns[side,key,i];
  for(i=1;i<=m;i++) for(j=i+1;j<=m;j++) if (arr[j]<arr[i]) {t=arr[i];arr[i]=arr[j];arr[j]=t}; return arr[int((m+1)/2)] }
END {
  printf "%-28s %12s %12s %8s %10s %10s %8s %8s\n", "benchmark", "old ns/op", "new ns/op", "new/old", "old B/op", "new B/op", "old allocs", "new allocs"
  for (k in keys) { o=median("old",k); w=median("new",k);
    printf "%-28s %12.0f %12.0f %8.3f %10s %10s %8s %8s\n", k, o, w, w/o, b["old",k], b["new",k], a["old",k], a["new",k] }
}' "$dir/results"
