#!/bin/sh
# Issue 47 on the lent H200, two steps on one warm machine (run from the repo root after `. /tmp/site/env.sh`):
#   sh scripts/device_s18.sh probe   section 18's arm divergence probe (scripts/s18_divergence_probe.py), every setting
#                                    in KMESH_PROBE_VARIANTS, 3 at a time: $OUT/s18-probe.tgz, $OUT/probe.log
#   sh scripts/device_s18.sh run     section 18 (scripts/device_run.sh 18; carry .whl) in bf16 with the setting the probe
#                                    left in /tmp/s18-probe/best.sets (or KMESH_S18_SETS): $OUT/18-gpu.tgz
# e.g. call 2: sh .device-stage/call2/install.sh && . /tmp/site/env.sh && timeout 340 sh scripts/device_s18.sh probe
#      call 3: . /tmp/site/env.sh && timeout 300 sh scripts/device_s18.sh run
set -u
out=${OUT:-/tmp}
probe=/tmp/s18-probe
t0=$(date +%s)
case "${1:-}" in
  probe)
    nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader || true
    rm -rf "$probe"
    variants=${KMESH_PROBE_VARIANTS:-bf16,bf16-bi,bf16-bi-triton,bf16-bi-flex,bf16-triton,fp32-bi,fp32}
    budget=${KMESH_PROBE_BUDGET:-290}
    timeout $((budget + 20)) python3 scripts/s18_divergence_probe.py --out "$probe" --variants "$variants" \
      --budget "$budget" --jobs 3 --child-timeout 200 >"$out/probe.log" 2>&1
    echo "probe rc $? after $(($(date +%s) - t0)) s"
    python3 - "$probe/summary.json" <<'EOF' || true
import json, sys
s = json.load(open(sys.argv[1]))
for v, r in s["variants"].items():
    print(v, r.get("status"), r.get("engine"), r.get("error") or "")
    for k, x in (r.get("norm_kernel_check") or {}).items():
        print("    norm check", k, x)
    for k, x in (r.get("outputs") or {}).items():
        print("   ", k, x)
    for pair in ("prefix", "suffix", "decode", "noise", "noise_d1"):
        c = r.get(pair) or {}
        f, b = c.get("first_output_differs"), c.get("first_born")
        print("   ", pair, c.get("positions"), "| differing", c.get("modules_differing"), "| first",
              f and (f["module"], f["max_abs_in"], f["max_abs_out"]), "| born", b and (b["module"], b["max_abs_out"]),
              c.get("error") or "")
print("best", s["best"])
EOF
    tar czf "$out/s18-probe.tgz" -C /tmp s18-probe ;;
  run)
    sets=${KMESH_S18_SETS:-$(cat "$probe/best.sets" 2>/dev/null)}
    echo "section 18 with: DTYPE=bfloat16 $sets"
    KMESH_SET_18="DTYPE=bfloat16 $sets" KMESH_SECTION_TIMEOUT=${KMESH_SECTION_TIMEOUT:-240} sh scripts/device_run.sh 18
    echo "rc $?; device_s18 run: $(($(date +%s) - t0)) s" ;;
  *) echo "usage: sh scripts/device_s18.sh probe|run" >&2; exit 2 ;;
esac
