#!/bin/sh
# The device `run` tool copies the working tree and what `carry` names, 64 MiB in all. A call that carries
# the 53 MiB wheel set leaves about 11 MiB for the tree: the tracked tree is 6.3 MB, of which outputs/ is
# 3.7 MB (1 Dec 2026) and grows with each published run. Move it out for such calls and back afterwards:
#   sh scripts/device_tree.sh aside     # outputs/ -> ../kmesh-outputs-aside
#   sh scripts/device_tree.sh back
# Commit nothing while it is aside: `git add -A` would record outputs/ as deleted.
set -eu
aside="$(cd .. && pwd)/kmesh-outputs-aside"
case "${1:-}" in
  aside)
    [ -e "$aside" ] && { echo "$aside exists: run 'back' first" >&2; exit 2; }
    mv outputs "$aside"
    du -sh --exclude=.git --exclude=.venv --exclude=.kmesh-cache --exclude=.device-stage --exclude=.whl \
      --exclude=.device-data . ;;
  back)
    [ -e outputs ] && { echo "outputs/ is already here" >&2; exit 2; }
    mv "$aside" outputs
    git status --short outputs | head -5 ;;
  *) echo "usage: sh scripts/device_tree.sh aside|back" >&2; exit 2 ;;
esac
