#!/usr/bin/env bash
# Fails when fusion_nb/ is not what nbs/ exports, or when a notebook is not nbdev-clean.
set -euo pipefail
cd "$(dirname "$0")/.."
snapshot() { find fusion_nb nbs -type f \( -name '*.py' -o -name '*.ipynb' \) -not -path '*/.ipynb_checkpoints/*' -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum; }
before=$(snapshot)
nbdev-export >/dev/null
nbdev-clean >/dev/null
after=$(snapshot)
if [ "$before" != "$after" ]; then
  echo "ERROR: notebooks are not clean or fusion_nb/ is stale. Run: nbdev-export && nbdev-clean" >&2
  diff <(echo "$before") <(echo "$after") >&2 || true
  exit 1
fi
echo "notebooks clean; fusion_nb/ matches nbs/"
# a merge's conflict markers committed by mistake (README.md once carried some)
if git grep -nE '^(<<<<<<<|>>>>>>>) ' -- . >&2; then echo "ERROR: merge conflict markers in tracked files (above)" >&2; exit 1; fi
echo "no merge conflict markers"
