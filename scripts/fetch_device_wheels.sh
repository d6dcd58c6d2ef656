#!/bin/sh
# Downloads the notebook stack (papermill, ipykernel, nbconvert) as CPython 3.12 wheels into .whl/
# (and pytest, for the tests marked gpu) for the H200 machine, which has no network. Packages the machine's image already has are left out.
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$tmp" papermill ipykernel nbconvert pytest
# a fresh folder each time: an earlier download's wheel beside a newer one of the same package makes the device's
# pip refuse both (6 Dec: wcwidth 0.9.4 and 0.9.5, one lent call lost)
rm -rf .whl.new && mkdir .whl.new
for f in "$tmp"/*.whl; do
  case $(basename "$f") in
    # on the image already, or optional for a headless kernel (debugpy, jedi), or in the vLLM stage (pyzmq)
    attrs-*|certifi-*|charset_normalizer-*|click-*|idna-*|jinja2-*|markupsafe-*|packaging-*|psutil-*|pygments-*|\
    python_dateutil-*|pyyaml-*|requests-*|tqdm-*|typing_extensions-*|urllib3-*|tzdata-*|pyzmq-*|debugpy-*|jedi-*) ;;
    *) cp "$f" .whl.new/ ;;
  esac
done
rm -rf "$tmp" .whl && mv .whl.new .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
du -sh .whl
