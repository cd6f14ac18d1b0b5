#!/usr/bin/env bash
# Fails when fusion_nb/ is not what nbs/ exports, when a notebook is not nbdev-clean, or when nbs/sidebar.yml misses a notebook.
set -euo pipefail
cd "$(dirname "$0")/.."
snapshot() { find fusion_nb nbs -type f \( -name '*.py' -o -name '*.ipynb' -o -name sidebar.yml \) -not -path '*/.ipynb_checkpoints/*' -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum; }
before=$(snapshot)
nbdev-export >/dev/null
nbdev-clean >/dev/null
nbdev-sidebar --force >/dev/null   # the site's navigation (Quarto's sidebar.yml), generated from nbs/'s folders
after=$(snapshot)
if [ "$before" != "$after" ]; then
  echo "ERROR: notebooks are not clean, fusion_nb/ is stale or nbs/sidebar.yml is. Run: nbdev-export && nbdev-clean && nbdev-sidebar --force" >&2
  diff <(echo "$before") <(echo "$after") >&2 || true
  exit 1
fi
echo "notebooks clean; fusion_nb/ matches nbs/"
# a merge's conflict markers committed by mistake (README.md once carried some)
if git grep -nE '^(<<<<<<<|>>>>>>>) ' -- . >&2; then echo "ERROR: merge conflict markers in tracked files (above)" >&2; exit 1; fi
echo "no merge conflict markers"
