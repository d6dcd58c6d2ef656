#!/bin/sh
# Publishes a run made on the GPU machine (scripts/device_run.sh): unpacks <section>-<profile>.tgz into
# outputs/<section>/<profile>-<date>/, renders report.html, verifies and writes public-results.json.
#   sh scripts/import_device_run.sh PATH/TO/<section>-<profile>.tgz
set -eu
tgz=$1
name=$(basename "$tgz" .tgz)
section=${name%-*}; profile=${name##*-}
section=$(.venv/bin/python -c "import sys; from kmesh_lib.app import registry as sections; print(sections.get(sys.argv[1]).key)" "$section")
stamp=$(date -u +%Y%m%d-%H%M%S)
dest="outputs/$section/$profile-$stamp"
tmp=$(mktemp -d)
tar xzf "$tgz" -C "$tmp"
mkdir -p "outputs/$section"
mv "$tmp/$name" "$dest"
rm -rf "$tmp"
sed -i "s|^RUN_DIR: .*|RUN_DIR: $dest|" "$dest/params.resolved.yaml"
.venv/bin/python -c "import json,sys; p=sys.argv[1]+'/results.json'; r=json.load(open(p)); r['run_id']=sys.argv[1].rsplit('/',1)[1]; json.dump(r,open(p,'w'),indent=1)" "$dest"
.venv/bin/kmesh report "$section" --run-dir "$dest"
.venv/bin/kmesh verify "$section" --run-dir "$dest" || echo "some checks failed: published as measured"
.venv/bin/kmesh publish "$section" --run-dir "$dest"
echo "$dest"
