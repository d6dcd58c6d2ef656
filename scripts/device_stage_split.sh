#!/bin/sh
# The device stage for a helper's clone: the device tool sends the *session's* checkout (not this clone), so the stage
# and this clone's commit travel through an ignored folder of that checkout, in three back-to-back calls that each
# stay under 64 MiB beside its tree (docs/notes/issue47-device-calls.md).
#   sh scripts/device_stage_split.sh DEST [EXTRA_DIR]
# DEST: a folder under the session checkout that its git ignores (e.g. /work/main/.device-stage/h3); EXTRA_DIR: copied
# into the tree as is (e.g. .device-data). Needs .device-stage/ (build-stage.sh) and .whl/ (fetch_device_wheels.sh).
# Builds DEST/a (40 MB of call 1's .so.xz), DEST/b (the rest of it, the lmcache wheel, the FA3 .so.xz) and DEST/c
# (the rest of call 2, and `git archive HEAD` of this clone without outputs/, with .whl/), then prints the three
# commands (carry paths relative to the session checkout). Remove DEST when the lease is over.
set -eu
dest=${1:?usage: sh scripts/device_stage_split.sh DEST [EXTRA_DIR]}
extra=${2:-}
stage=.device-stage
[ -f "$stage/call1/_C_stable_libtorch.abi3.so.xz" ] && [ -f "$stage/call2/install.sh" ] || {
  echo "no $stage/call1 or call2: run sh ../shared/device/build-stage.sh first" >&2; exit 2; }
[ -d .whl ] || { echo "no .whl/: run sh scripts/fetch_device_wheels.sh first" >&2; exit 2; }
mkdir -p "$dest"
dest=$(cd "$dest" && pwd -P)
root=$(git -C "$dest" rev-parse --show-toplevel 2>/dev/null) || {
  rmdir "$dest" 2>/dev/null; echo "$dest is not inside a git checkout" >&2; exit 2; }
rel=${dest#"$root"/}
git -C "$root" check-ignore -q "$rel" || {
  rmdir "$dest" 2>/dev/null; echo "$rel is not ignored in $root: choose an ignored folder" >&2; exit 2; }
rm -rf "$dest/a" "$dest/b" "$dest/c"
mkdir -p "$dest/a" "$dest/b" "$dest/c/call2" "$dest/c/tree"
split -b 40000000 -d -a 1 "$stage/call1/_C_stable_libtorch.abi3.so.xz" "$dest/part."
mv "$dest/part.0" "$dest/a/" && mv "$dest/part.1" "$dest/b/"
cp "$stage"/call2/lmcache-*.whl "$stage"/call2/_vllm_fa3_C.abi3.so.xz "$dest/b/"
for f in "$stage"/call2/*; do
  case $(basename "$f") in lmcache-*.whl|_vllm_fa3_C.abi3.so.xz) ;; *) cp -R "$f" "$dest/c/call2/" ;; esac
done
git archive HEAD | tar x -C "$dest/c/tree"
python3 scripts/tree_manifest.py >/dev/null && cp .kmesh-tree.json "$dest/c/tree/"  # the copy measures its own commit
rm -rf "$dest/c/tree/outputs"
cp -R .whl "$dest/c/tree/.whl"
[ -n "$extra" ] && cp -R "$extra" "$dest/c/tree/"
du -sh "$dest/a" "$dest/b" "$dest/c"
cat <<EOF
Three calls, back to back (the machine keeps /tmp about 30 s):
  A carry ["$rel/a"]: mkdir -p /tmp/parts && cp $rel/a/* /tmp/parts/ && echo A_OK
  B carry ["$rel/b"]: cp $rel/b/part.1 /tmp/parts/ && mkdir -p /tmp/call2 && cp $rel/b/*.whl $rel/b/*.so.xz /tmp/call2/ && echo B_OK
  C carry ["$rel/c"]: mkdir -p /tmp/stage && cat /tmp/parts/part.0 /tmp/parts/part.1 > /tmp/stage/_C_stable_libtorch.abi3.so.xz && cp -r $rel/c/call2/* /tmp/call2/ && rm -rf /tmp/tree && cp -r $rel/c/tree /tmp/tree && sh /tmp/call2/install.sh && . /tmp/site/env.sh && cd /tmp/tree && <your command>
Later calls on the warm machine: . /tmp/site/env.sh && cd /tmp/tree && <command>
EOF
