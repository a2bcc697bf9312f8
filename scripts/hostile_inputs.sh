#!/usr/bin/env bash
# The hostile-but-fair inputs of issue 20, each run as a user would: exit status, wall seconds and
# peak memory (MaxRSS). Every one should end in exit 2 (one line) or 3 within 10 s and 1 GiB.
# Usage: scripts/hostile_inputs.sh [archsim command, default: archsim]
set -u
A=${1:-archsim}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
printf 'a: %s%s\n' "$(printf '[%.0s' $(seq 600))" "$(printf ']%.0s' $(seq 600))" > "$T/deep.yaml"
{ echo 'a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]'
  for i in 1 2 3 4 5 6 7; do echo "a$i: &a$i [$(printf "*a$((i-1)),%.0s" $(seq 9))*a$((i-1))]"; done
  echo 'cores: {per_group: *a7}'; } > "$T/bomb.yaml"
printf 'dram:\n  channel_gbps: .inf\n' > "$T/inf.yaml"
printf '.kernel k\n.param out\n.launch grid=1 block=32\n.arg out f32[100000000000] zeros\n        exit\n' > "$T/big.s"
python3 - "$T/long.s" <<'PY'
import sys
lines = [".kernel big", ".launch grid=1 block=32", "  s2r r0, %tid.x", "  setp.lt.i64 p0, r0, 16", "  mov.b64 r1, 0"]
for i in range(200000):
    lines.append(f"L{i}: @p0 bra L{i + 3}" if i % 50 == 0 else f"L{i}:  add.i64 r1, r1, 1")
lines.append("L200000: L200001: L200002: exit")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
printf 'hw: tiny-gpu\nworkload: tiny\nvary:\n  clock_ghz: [%s]\n  dram.channel_gbps: [%s]\n' \
  "$(seq -s, 1 1000)" "$(seq -s, 1 1000)" > "$T/million.yaml"
head -c 300 /bin/ls > "$T/garbage.bin"
echo '{"schema": "archsim.result/1"}' > "$T/schema_only.json"
run() {
  /usr/bin/time -f "%e %M" -o "$T/time" timeout 60 "$@" > /dev/null 2> "$T/err"
  rc=$?
  read -r s kb < <(tail -1 "$T/time")
  printf '%-4s %6.1f s %6d MB  %s\n      %s\n' "$rc" "$s" $((kb / 1024)) "${*:2}" "$(grep -v '^  ' "$T/err" | head -c 200 | head -2 | tr '\n' '|')"
}
run $A run --hw tiny-gpu --workload tiny --set l1.mshrs=3
run $A run --hw "$T/deep.yaml" --workload tiny
run $A run --hw tiny-gpu --workload tiny --set cores.per_group=1000000000000
run $A run --hw tiny-gpu --workload tiny --set l2.size_kib=1073741824
run $A run --hw tiny-gpu --workload tiny --set clock_ghz=1e9
run $A run --hw tiny-gpu --workload tiny --set cores.per_group=99999999999999999999999999
run $A run --hw tiny-gpu --workload tiny --overlay "$T/inf.yaml"
run $A asm vector_add --hw tiny-gpu --grid 1000000000
run $A asm "$T/big.s" --hw tiny-gpu
run $A asm "$T/long.s" --hw tiny-gpu
run $A micro latency --hw tiny-gpu --param footprint_kib=1e12
run $A micro latency --hw tiny-gpu --param footprint_kib=4194304
run $A validate --hw tiny-gpu --reference "$T/garbage.bin"
run $A plot "$T/schema_only.json"
run $A run --hw tiny-gpu --workload tiny --overlay "$T/bomb.yaml"
run $A run --hw tiny-gpu --workload tiny --seq 10000000
run $A run --hw tiny-gpu --workload tiny --batch 100000
run $A run --hw tiny-gpu --workload tiny --mode functional --seq 1000000
run $A run --hw a100 --workload gpt2-small --seq 10000000
run $A sweep "$T/million.yaml" --out "$T/o"
run $A run --hw tiny-gpu --workload tiny --max-cycles 10 --json "$T/p.json"
run $A run --hw /dev/null --workload tiny
