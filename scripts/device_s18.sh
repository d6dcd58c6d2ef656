#!/bin/sh
# Issue 47 on the lent H200: section 18's arm divergence probe (scripts/s18_divergence_probe.py), then section 18
# itself (scripts/device_run.sh 18) with the bf16 setting the probe found closest (its best.sets, as KMESH_SET_18).
# Run from the repo root after `sh .device-stage/call2/install.sh && . /tmp/site/env.sh`, carrying .whl:
#   KMESH_GIT_COMMIT=<hash> timeout 570 sh scripts/device_s18.sh 2>&1 | tee $OUT/call.log
# Results: $OUT/s18-probe.tgz (every variant's per-module comparison and log) and $OUT/18-gpu.tgz (the run folder).
# KMESH_PROBE_VARIANTS (comma list, default all), KMESH_PROBE_BUDGET (300 s), KMESH_S18_SETS (skip the choice: use
# these --set overrides), KMESH_S18_RUN=0 (probe only).
set -u
out=${OUT:-/tmp}
probe=/tmp/s18-probe
t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader || true
rm -rf "$probe"
variants=${KMESH_PROBE_VARIANTS:-bf16,bf16-bi,bf16-bi-triton,bf16-bi-flex,bf16-triton,fp32-bi,fp32}
timeout $((${KMESH_PROBE_BUDGET:-300} + 30)) python3 scripts/s18_divergence_probe.py --out "$probe" \
  --variants "$variants" --budget "${KMESH_PROBE_BUDGET:-300}" --jobs 3 >"$out/probe.log" 2>&1
echo "probe rc $? after $(($(date +%s) - t0)) s"
python3 - "$probe/summary.json" <<'EOF' || true
import json, sys
s = json.load(open(sys.argv[1]))
for v, r in s["variants"].items():
    o = r.get("outputs") or {}
    print(v, r.get("status"), (r.get("engine") or {}).get("attention_backends"), r.get("error") or "")
    for k, x in o.items():
        print("   ", k, x)
    for pair in ("prefix", "suffix", "decode", "noise", "noise_d1"):
        c = r.get(pair) or {}
        f, b = c.get("first_output_differs"), c.get("first_born")
        print("   ", pair, c.get("positions"), "differing:", c.get("modules_differing"), "first:",
              f and (f["module"], f["max_abs_in"], f["max_abs_out"]), "born:", b and (b["module"], b["max_abs_out"]),
              c.get("error") or "")
print("best", s["best"])
EOF
tar czf "$out/s18-probe.tgz" -C /tmp s18-probe
sets=${KMESH_S18_SETS:-$(cat "$probe/best.sets" 2>/dev/null)}
[ "${KMESH_S18_RUN:-1}" = 1 ] || exit 0
echo "section 18 with: DTYPE=bfloat16 $sets"
KMESH_SET_18="DTYPE=bfloat16 $sets" KMESH_SECTION_TIMEOUT=${KMESH_SECTION_TIMEOUT:-220} sh scripts/device_run.sh 18
echo "device_s18: $(($(date +%s) - t0)) s"
