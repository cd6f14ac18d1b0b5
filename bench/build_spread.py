"""The spread between honest builds: the tiny zoo trained from other seeds on the same datasets, the same experiments on each.

    python bench/build_spread.py --profile tiny --only 01 04 --seeds 1 2     # seed 0 is the pinned build (pins/)
    python bench/build_spread.py --profile micro --only 01 --seeds 1         # a smoke run

Two machines build different zoos from one commit (their CPU kernels round differently, and training carries that into
the weights), so a finding on the tiny profile means something only if it holds by more than the difference between
two such builds. This script stands other seeds in for the other machines: in a fresh copy of this checkout it builds the
benchmark's zoo once per seed (`FUSION_NB_BUILD_SEED`; seed 0 is copied from the pins) and runs the experiments on each,
then writes every table row's average (the `Avg.` column of each `table*.csv`) per seed, with the spread (largest minus
smallest), to `data/paper_values/build_spread_<profile>.csv`, which the findings of the experiment notebooks read.
Only the benchmark's zoo (the CLIP and its experts) is reseeded; the zoos experiments build on first use are not.
"""
from __future__ import annotations
import argparse, json, os, sys, time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_time import REPO, cli, env_for, fresh_copy, run_logged

def averages(output:Path)->pd.DataFrame:
    "experiment, table, row, Avg. of every `table*.csv` with an `Avg.` column under one run's output folder."
    out = []
    for f in sorted(output.glob('*/table*.csv')):
        t = pd.read_csv(f, index_col=0)
        if 'Avg.' not in t.columns: continue
        avg = pd.to_numeric(t['Avg.'], errors='coerce')   # a second header row ('Mer.', 'Ens.') is not a value
        out += [dict(experiment=f.parent.name, table=f.stem, row=str(r), value=float(v)) for r, v in avg.items() if pd.notna(v)]
    return pd.DataFrame(out)

def spread_table(runs:dict[int, pd.DataFrame])->pd.DataFrame:
    "One row per (experiment, table, row): the value of each seed, then min, max and spread (max − min)."
    wide = pd.concat({f'seed {s}': runs[s].set_index(['experiment', 'table', 'row'])['value'] for s in sorted(runs)}, axis=1)
    seeds = list(wide.columns)
    return wide.assign(min=wide[seeds].min(axis=1), max=wide[seeds].max(axis=1),
                       spread=wide[seeds].max(axis=1) - wide[seeds].min(axis=1)).round(2).reset_index()

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--only', nargs='+', required=True, help='experiments to run on each build')
    ap.add_argument('--seeds', nargs='+', type=int, default=[1, 2], help='training seeds besides the pinned 0')
    ap.add_argument('--root', type=Path, default=None, help='a copy to work in (default: a fresh copy of this checkout, kept)')
    ap.add_argument('--out', type=Path, default=None, help='default: data/paper_values/build_spread_<profile>.csv here')
    a = ap.parse_args(argv)
    import tempfile
    root = a.root or fresh_copy(Path(tempfile.mkdtemp(prefix='build-spread-')))
    print(f"copy: {root}", flush=True)
    runs, t0 = {}, time.time()
    if 0 in a.seeds: ap.error('seed 0 is the pinned build, always included')
    for s in [*a.seeds, 0]:   # the pinned build last: the copy is left as the checkout builds it
        env = env_for(root); env.pop('FUSION_NB_BUILD_SEED', None)
        if s: env['FUSION_NB_BUILD_SEED'] = str(s)
        output = root/'spread'/f'seed{s}'
        rc, _, wall = run_logged(cli(root, 'reproduce', '--profile', a.profile, '--only', *a.only, '--force', output_root=output), env, root)
        if rc: print(f"seed {s}: fusion-nb reproduce failed ({rc})"); return rc
        runs[s] = averages(output/a.profile)
        print(f"seed {s}: {wall:.0f} s", flush=True)
    manifest = json.loads((root/'data'/a.profile/'manifest.json').read_text())   # the last build: seed 0, the pinned one
    table = spread_table(runs)
    out = a.out or REPO/'data'/'paper_values'/f'build_spread_{a.profile}.csv'
    header = (f"# build spread, profile {a.profile}: zoo recipe {manifest['recipes']['zoo']} (seed 0 = the pins), training seeds "
              f"{[0, *a.seeds]}; python bench/build_spread.py --profile {a.profile} --only {' '.join(a.only)} "
              f"--seeds {' '.join(map(str, a.seeds))}; {time.time() - t0:.0f} s\n")
    out.write_text(header + table.to_csv(index=False))
    print(table.to_string(index=False)); print(f"\nwritten: {out}")
    return 0

if __name__ == '__main__':
    sys.exit(main())
