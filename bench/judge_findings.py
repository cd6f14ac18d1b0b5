"""Every finding of the tiny experiments judged against the build spread file, as the experiment notebooks judge them, and counted.

    python bench/judge_findings.py                        # data/paper_values/build_spread_tiny.csv: seed 0 is the run judged
    python bench/judge_findings.py --spread F --only 04 10 # another spread file; some experiments
    python bench/judge_findings.py --outputs R/spread/seed0/tiny   # the findings of another run (default: outputs/tiny)

Paper 002's criteria (20, 21) read only the file, so where `--outputs` lacks them they are named from the file's rows.

The spread file keeps, per build (seed), every table average and every finding's difference (or 1/0 where a finding is a
criterion over many numbers), so the verdicts of its seed-0 build can be re-judged when builds are added, without running the
experiments again. The judging is the package's (`fusion_nb.reproduce.reports`): `judge_beyond_spread` for orderings of table
rows (experiments 04 and 40: "A > B") and for papers 001/003's claims (`claims_beyond_spread`: a claim's margin against the
spread of that margin), `verdicts_across_builds` for paper 002's criteria (a verdict stands only where every build agrees).
The findings and their directions are read from a run's `findings*.csv` (`--outputs`): what each notebook claimed, in its words;
the values judged are the file's seed 0, and each experiment's line says in how many findings the run's own value is that seed 0
(`same_as_seed0`; where it is not, the run is not the build the file measured, and its verdicts are not these).
Where a notebook judged a claim over its own seeds (`verdict over seeds`: 30 and 31's "within noise"), that verdict is the run's,
so a claim whose run is not the file's seed 0 is counted as not judged rather than mixed with seed 0's value.
"""
from __future__ import annotations
import argparse, sys
from pathlib import Path

import pandas as pd

from fusion_nb.reproduce.reports import (claims_beyond_spread, finding_label, judge_beyond_spread, load_build_spread, same_as_seed0,
                                          verdicts_across_builds)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_spread import seed_columns

REPO = Path(__file__).resolve().parents[1]
ORDERINGS, CLAIMS, CRITERIA = ('04', '40'), ('10', '30', '31'), ('20', '21')
NOT_SEED0 = "not judged (the run's seeds are another build's than the file's seed 0)"

def orderings(spread:pd.DataFrame, experiment:str, found:pd.DataFrame)->pd.DataFrame:
    "Each 'A > B' of a findings table judged on the table rows A and B of the spread file (the table holding both)."
    rows = spread.xs(experiment, level='experiment')
    out = []
    for finding, here in zip(found['finding'], found['difference here']):
        a, b = finding.split(' > ', 1)
        b = b.replace(' (random, same size)', '')   # experiment 40's authors' comparisons: the file's table1_authors_mean names the baselines plainly
        tables = [t for t in rows.index.get_level_values('table').unique() if {a, b} <= set(rows.xs(t, level='table').index)]
        if not tables: out.append(dict(finding=finding, verdict='build spread not measured')); continue
        t = rows.xs(tables[0], level='table')[seed_columns(spread)].astype(float)
        d = t.loc[a] - t.loc[b]   # the file keeps each row to two decimals: the run's difference agrees with seed 0's within 0.01
        out.append(dict(finding=finding, **{'difference here': d['seed 0']}, **judge_beyond_spread(d['seed 0'], d),
                        **{'seed 0 is this run': bool(abs(float(here) - d['seed 0']) <= 0.01 + 1e-9)}))
    return pd.DataFrame(out).set_index('finding')

def claims(spread:pd.DataFrame, experiment:str, found:pd.DataFrame)->pd.DataFrame:
    "Papers 001/003's claims: the margin of seed 0 against the spread of that margin; a claim's direction is read from the run (its sign agrees with `holds`)."
    name = found.columns[0]
    holds = found['holds here' if 'holds here' in found.columns else 'holds'].astype(bool)
    said = found['verdict over seeds'] if 'verdict over seeds' in found.columns else holds.map({True: 'holds', False: 'does not hold'})
    f = pd.DataFrame({'difference (points)': found['difference (points)'].values, 'verdict': said.values}, index=found[name].values)
    signs = {c: (1 if (d > 0) == h or d == 0 else -1) for c, d, h in zip(f.index, f['difference (points)'], holds)}
    builds = spread.xs((experiment, 'findings'), level=('experiment', 'table'))
    run = f['difference (points)'].copy()
    f['difference (points)'] = [builds.loc[c, 'seed 0'] if c in builds.index else d for c, d in zip(f.index, run)]
    out = claims_beyond_spread(f, builds, signs)
    out['seed 0 is this run'] = [c in builds.index and same_as_seed0(d, builds.loc[c, seed_columns(builds)]) for c, d in zip(f.index, run)]
    if 'verdict over seeds' in found.columns:   # the seeds' verdict (30, 31: 'within noise') is the run's own: judged with the file's seed 0 only where the run is that build
        out.loc[~out['seed 0 is this run'], 'verdict'] = NOT_SEED0
    return out

def criteria(spread:pd.DataFrame, experiment:str, found:pd.DataFrame)->pd.DataFrame:
    "Paper 002's criteria: 1 where a finding held in a build, 0 where not; the verdict stands where every build agrees with seed 0."
    ids = list(found.columns[:list(found.columns).index('holds')])
    builds = spread.xs((experiment, 'findings'), level=('experiment', 'table'))
    f = found.set_index(ids)[['holds']]
    run = f['holds'].astype(bool).copy()
    f['holds'] = [bool(builds.loc[finding_label(i), 'seed 0']) if finding_label(i) in builds.index else h for i, h in zip(f.index, run)]
    out = verdicts_across_builds(f, builds)
    out['seed 0 is this run'] = [finding_label(i) in builds.index and bool(builds.loc[finding_label(i), 'seed 0']) == h for i, h in zip(f.index, run)]
    return out

def from_file(spread:pd.DataFrame, experiment:str)->pd.DataFrame:
    """Paper 002's findings as the spread file names them ('finding / dataset'), for an experiment the run given lacks: a criterion's
    verdict reads only the file (its seed 0 and the builds that agree), so `--outputs` of a run without 20 or 21 still judges them."""
    rows = spread.xs((experiment, 'findings'), level=('experiment', 'table'))
    parts = [str(r).split(' / ') for r in rows.index]
    cols = ['finding', 'dataset'][:max(map(len, parts))]
    return pd.DataFrame([dict(zip(cols, p), holds=bool(v)) for p, v in zip(parts, rows['seed 0'])])[[*cols, 'holds']]

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--outputs', type=Path, default=REPO/'outputs'/'tiny', help="a tiny run's outputs: the findings, their words and directions")
    ap.add_argument('--spread', type=Path, default=None, help='default: data/paper_values/build_spread_tiny.csv')
    ap.add_argument('--only', nargs='+', default=list(ORDERINGS + CLAIMS + CRITERIA))
    a = ap.parse_args(argv)
    if a.spread: spread = pd.read_csv(a.spread, comment='#').set_index(['experiment', 'table', 'row'])
    else: spread = load_build_spread('tiny', REPO)[0]
    pd.set_option('display.width', 250); pd.set_option('display.max_colwidth', 90); pd.set_option('display.max_rows', 200)
    counts = {}
    ran = {d.name for d in a.outputs.iterdir() if d.is_dir()} if a.outputs.is_dir() else set()
    kept = set(spread.index.get_level_values('experiment')) - ran   # criteria of an experiment the run lacks: named by the file alone
    for exp in sorted(e for e in ran | {e for e in kept if e[:2] in CRITERIA} if e[:2] in a.only):
        files = sorted((a.outputs/exp).glob('findings*.csv'))
        found = pd.read_csv(files[-1]) if files else from_file(spread, exp) if exp[:2] in CRITERIA else None   # 40: findings_beyond_spread.csv
        if found is None: continue
        judge = orderings if exp[:2] in ORDERINGS else claims if exp[:2] in CLAIMS else criteria
        v = judge(spread, exp, found)
        same = int(v['seed 0 is this run'].sum())
        print(f'## {exp} ({len(v)} findings, {len(seed_columns(spread))} builds in the file; '
              + (f'seed 0 is this run in {same} of {len(v)})' if files else 'not in this run: named from the file)'))
        print(v[[c for c in ['difference here', 'difference (points)', 'across builds', 'builds where it holds', 'build spread', 'verdict'] if c in v.columns]].round(2).to_string(), '\n')
        counts[exp] = v['verdict'].str.split(' \\(').str[0].value_counts()
        if exp[:2] == '04' and len(experts := load_build_spread('tiny', REPO, kind='expert')[0]):   # paper 000's own variation, beside the verdict
            e = orderings(experts, exp, found)
            print("### against the experts' spread on the pinned CLIP (data/paper_values/expert_spread_tiny.csv; the verdict above stays the builds')")
            print(e[['build spread', 'verdict']].rename(columns={'build spread': "experts' spread"}).round(2).to_string(), '\n')
    total = pd.DataFrame(counts).fillna(0).astype(int).T
    total.loc['all'] = total.sum()
    print(total.to_string())
    return 0

if __name__ == '__main__': sys.exit(main())
