"""The spread between honest builds: the tiny zoo trained from other seeds on the same datasets, the same experiments on each.

    python bench/build_spread.py --profile tiny --only 01 04 --seeds 1 2     # seed 0 is the pinned build (pins/)
    python bench/build_spread.py --profile micro --only 01 --seeds 1         # a smoke run
    python bench/build_spread.py --profile tiny --only 40 --seeds 1 2 --papermill   # paper 004: its LLaVA zoo reseeded, not the benchmark's
    python bench/build_spread.py --profile tiny --only 10 --seeds 1 2     # paper 001: the benchmark's zoo, the half experts, the second backbone
    python bench/build_spread.py --profile tiny --only 20 21 --seeds 1 2 --papermill   # paper 002: its robust zoo reseeded, not the benchmark's
    python bench/build_spread.py --profile tiny --only 20 --seeds 1 2 --papermill --root R --reuse --keep-rows 21 --note "…"   # the robust zoo re-keyed, 21's inputs unchanged
    python bench/build_spread.py --profile tiny --only 04 10 --seeds 2 --root R --reuse --keep-pinned   # seed 2's outputs already in R/spread/seed2
                                                                          # (FUSION_NB_BUILD_SEED=2 fusion-nb reproduce … --output-root R/spread/seed2):
                                                                          # seeds 0 and 1 stay the file's, nothing of the pins is rerun

Two machines build different zoos from one commit (their CPU kernels round differently, and training carries that into
the weights), so a finding on the tiny profile means something only if it holds by more than the difference between
two such builds. This script stands other seeds in for the other machines: in a fresh copy of this checkout it builds the
benchmark's zoo once per seed (`FUSION_NB_BUILD_SEED`; seed 0 is copied from the pins) and runs the experiments on each,
then writes every table row's average (the `Avg.` column of each `table*.csv`) per seed, with the spread (largest minus
smallest), to `data/paper_values/build_spread_<profile>.csv`, which the findings of the experiment notebooks read.
The seed reseeds the benchmark's zoo (the CLIP and its experts), paper 004's LLaVA zoo (experiment 40) and paper 001's
second backbone (experiment 10) and paper 002's robust zoo (experiments 20 and 21; on the same stand-in images); paper
001's half experts are fine-tuned again from the reseeded CLIP (their recipe names its weights), with their own seed kept
(it also draws the halves the experiment reads); paper 002's AdvProp model (one row of experiment 21's Table 1) is not
reseeded (its recipe digests its own module). Rows of experiments not run are kept while they were measured on the same
benchmark zoo, or on a zoo of their own (20, 21, 40) that this run did not re-key (`--keep-rows` keeps them anyway, where
their inputs' bytes did not change: `--note` says why); seeds measured before on the same zoo add up with this run's
(`--seeds 1` now, `--seeds 2` later: three builds).
"""
from __future__ import annotations
import argparse, json, os, re, subprocess, sys, time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from fusion_nb.reproduce.reports import finding_label
from fusion_nb.reproduce.runner import KERNEL_START_TIMEOUT

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_time import REPO, cli, env_for, fresh_copy, run_logged

def averages(output:Path)->pd.DataFrame:
    """experiment, table, row, value of every average in the `table*.csv` under one run's output folder (and of each finding in
    its `findings*.csv`: a claim's `difference (points)`, else 1 or 0 as it holds or not): the `Avg.` column
    (row: the table's row), or each `avg_…` column (paper 004's held-in and held-out averages; row: `<row> · <column>`,
    where a row named by several leading text columns, as Table 3's guidance and order, joins them with ', ')."""
    out = []
    done = lambda files: [f for f in files if not f.parent.name.startswith('.')]   # '.<experiment>.<pid>.tmp': a run still writing
    for f in done(sorted(output.glob('*/table*.csv'))):
        t = pd.read_csv(f, index_col=0)
        if 'Avg.' in t.columns:
            avg = pd.to_numeric(t['Avg.'], errors='coerce')   # a second header row ('Mer.', 'Ens.') is not a value
            out += [dict(experiment=f.parent.name, table=f.stem, row=str(r), value=float(v)) for r, v in avg.items() if pd.notna(v)]
            continue
        t = pd.read_csv(f)
        cols = [c for c in t.columns if str(c).startswith('avg_')]
        if not cols: continue
        ids = list(t.columns[:next(i for i, c in enumerate(t.columns) if pd.api.types.is_numeric_dtype(t[c]) or c in cols)]) or [t.columns[0]]
        for _, r in t.iterrows():
            name = ', '.join(str(r[c]) for c in ids)
            for c in cols:   # '30.0 ± 0.0' (a mean with its error) is not a value: the table's `_mean` twin holds it
                v = pd.to_numeric(pd.Series([r[c]]), errors='coerce').iloc[0]
                if pd.notna(v): out.append(dict(experiment=f.parent.name, table=f.stem, row=f'{name} · {c}', value=float(v)))
    for f in done(sorted(output.glob('*/findings*.csv'))):
        t = pd.read_csv(f)
        if 'difference (points)' in t.columns:   # a paper's claims, each a difference in points (papers 001 and 003), named by the first column
            out += [dict(experiment=f.parent.name, table=f.stem, row=str(r), value=float(v)) for r, v in zip(t.iloc[:, 0], t['difference (points)'])]
        elif 'holds' in t.columns:   # a criterion over many numbers (paper 002): 1 where it holds, 0 where not
            ids = list(t.columns[:list(t.columns).index('holds')])
            out += [dict(experiment=f.parent.name, table=f.stem, row=finding_label(tuple(r[ids]) if len(ids) > 1 else r[ids[0]]),
                         value=float(str(r['holds']).strip().lower() in ('true', '1', '1.0'))) for _, r in t.iterrows()]
    return pd.DataFrame(out)

def experiments(root:Path, only:Sequence[str])->list[str]:
    "The experiment notebooks of the copy that `--only` names, as `fusion-nb reproduce` reads it (prefixes, comma lists)."
    from fusion_nb.reproduce.profiles import select_experiments
    return select_experiments(sorted(n.stem for n in (root/'nbs'/'experiments').glob('*.ipynb')), only)

def unfinished(output:Path, names:Sequence[str])->list[str]:
    "The experiments `names` with no finished output folder under one run's `output` (a stopped run leaves only '.<name>.<pid>.….tmp')."
    return [n for n in names if not (output/n).is_dir()]

def pinned_build(root:Path, profile:str):
    "The copy's benchmark as the checkout builds it (seed 0: restored from the pins)."
    env = {k: v for k, v in env_for(root).items() if k != 'FUSION_NB_BUILD_SEED'}
    subprocess.run([sys.executable, '-c', f"from fusion_nb.reproduce.profiles import load_profile, prepare; prepare(load_profile({profile!r}), "
                    "progress=False)"], env=env, cwd=root, check=True)

def seed_columns(table:pd.DataFrame)->list[str]:
    "The table's `seed N` columns, by N."
    return sorted((c for c in table.columns if str(c).startswith('seed ')), key=lambda c: int(c.split()[1]))

def with_spread(wide:pd.DataFrame)->pd.DataFrame:
    "Seed columns indexed by (experiment, table, row) → the file's rows: each seed's value, then min, max and spread (max − min)."
    seeds = seed_columns(wide)
    return wide[seeds].assign(min=wide[seeds].min(axis=1), max=wide[seeds].max(axis=1),
                              spread=wide[seeds].max(axis=1) - wide[seeds].min(axis=1)).round(2).reset_index()

def spread_table(runs:dict[int, pd.DataFrame])->pd.DataFrame:
    "One row per (experiment, table, row): the value of each seed, then min, max and spread (max − min)."
    return with_spread(pd.concat({f'seed {s}': runs[s].set_index(['experiment', 'table', 'row'])['value'] for s in sorted(runs)}, axis=1))

# Experiments whose builds train a zoo of their own, not the benchmark's (the CLIP and its experts): their rows stay valid
# when only the benchmark's zoo changes, with the recipe of their own zoo (the header's 'robust zoo', 'llava zoo').
OWN_ZOO = {'20': 'robust zoo', '21': 'robust zoo', '40': 'llava zoo'}

def own_zoo(experiment:str)->str|None: return OWN_ZOO.get(experiment[:2])

def run_only(run:str)->list[str]:
    "The experiments a run recorded in the header ran: `--only 01 04` → ['01', '04']."
    m = re.search(r'--only ((?:\S+ )+?)--', run + ' --')
    return m.group(1).split() if m else []

def seeds_in(table:pd.DataFrame)->list[int]:
    "The seeds a spread table holds a value of."
    return [int(c.split()[1]) for c in seed_columns(table) if table[c].notna().any()]

def split_runs(text:str)->list[str]:
    "The header's runs, split at '; ' outside parentheses (a run's note may hold '; ')."
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == '(') - (ch == ')')
        if depth == 0 and text.startswith('; ', i): out.append(text[start:i]); start = i + 2
    return [*out, text[start:]]

def merge_previous(out:Path, table:pd.DataFrame, recipes:dict, only:list[str],
                   keep_rows:Sequence[str]=())->tuple[pd.DataFrame, dict, list[str]]:
    """This run's table merged with the file it replaces: rows of other experiments are kept (with the runs that measured them)
    when they were measured on the same benchmark zoo, or read a zoo of their own (`OWN_ZOO`) whose recipe this run did not
    change (`recipes` holds the own zoos' recipes this run measured on); for this run's experiments, the seeds measured before
    on the same zoos and not run now are kept beside this run's (so seeds add up over runs). `keep_rows`: experiments whose
    rows stay although their own zoo was re-keyed (the caller knows their inputs' bytes did not change, and says so)."""
    old_head = out.read_text().split('\n', 1)[0]
    old_recipes = dict(re.findall(r'([a-z][a-z ]*?) recipe ([0-9a-f]+)', old_head))
    old = pd.read_csv(out, comment='#')
    same = old_recipes.get('zoo') == recipes['zoo']
    rebuilt = {k for k, v in recipes.items() if k != 'zoo' and k in old_recipes and old_recipes[k] != v}   # own zoos this run changed
    stale = lambda e: own_zoo(e) in rebuilt and e[:2] not in keep_rows
    experiments = set(table.experiment)
    keep = old[~old.experiment.isin(experiments)]
    if not same: keep = keep[keep.experiment.map(own_zoo).notna()]   # measured on another benchmark zoo: dropped, not mislabelled
    keep = keep[~keep.experiment.map(stale).astype(bool)]   # measured on another of its own zoo: dropped too
    seeds_now = seed_columns(table)
    mine = old.experiment.isin(experiments) & ~old.experiment.map(lambda e: own_zoo(e) in rebuilt).astype(bool)   # no seed of another own zoo
    before = old[mine].set_index(['experiment', 'table', 'row']) if same else pd.DataFrame()
    extra = [c for c in seed_columns(before) if c not in seeds_now and before[c].notna().any()]
    if extra:   # seeds of an earlier run on this zoo, beside this run's
        now = table.set_index(['experiment', 'table', 'row'])[seeds_now]
        only_before = before.loc[before.index.difference(now.index), extra]   # a row only earlier seeds measured is kept, after this run's
        table = with_spread(pd.concat([now.join(before[extra], how='left'), only_before]))
    table = pd.concat([keep, table], ignore_index=True)
    table = table[['experiment', 'table', 'row', *seed_columns(table), 'min', 'max', 'spread']]
    kept_zoos = {own_zoo(e) for e in keep.experiment} - {None}
    recipes = {**{k: v for k, v in old_recipes.items() if k != 'zoo' and (same or k in kept_zoos)}, **recipes}   # this run's win
    runs = split_runs(old_head.split('runs: ', 1)[-1]) if 'runs: ' in old_head else \
           [f"{old_head.split('; ')[1]} ({old_head.split('; ')[2]})"]   # the first file's layout
    def kept(run:str)->bool:
        ran = run_only(run)
        if not ran: return same or any(z in run.lower() for z in kept_zoos)   # a note on a zoo (a re-key, a rebuild)
        if not same: return all(own_zoo(e) for e in ran) and not set(ran) & set(only)
        if all(e in only or (own_zoo(e) in rebuilt and e not in keep_rows) for e in ran) and not extra: return False   # none of its rows left
        return ran != only or bool(extra)   # the same experiments: kept while seeds it measured are kept
    return table, recipes, [r for r in runs if kept(r)]

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--only', nargs='+', required=True, help='experiments to run on each build')
    ap.add_argument('--seeds', nargs='+', type=int, default=[1, 2], help='training seeds besides the pinned 0')
    ap.add_argument('--root', type=Path, default=None, help='a copy to work in (default: a fresh copy of this checkout, kept)')
    ap.add_argument('--out', type=Path, default=None, help='default: data/paper_values/build_spread_<profile>.csv here')
    ap.add_argument('--reuse', action='store_true', help="read the seeds' outputs a previous run left in the copy (--root) instead of running "
                    "(a seed where an experiment of --only did not finish is run)")
    ap.add_argument('--keep-pinned', action='store_true', help="seed 0's values are the file's (measured on the pins' zoo, which is checked): "
                    "only --seeds are run or read; with --reuse, adds a seed to the file without running the pinned build's experiments again")
    ap.add_argument('--keep-rows', nargs='+', default=[], metavar='EXP', help="experiments (20, 21, 40) whose rows stay although this run "
                    "re-keyed their own zoo: only where their inputs' bytes did not change; give the reason with --note")
    ap.add_argument('--note', default='', help="a sentence for the header's runs (why rows were kept, how the seeds ran)")
    ap.add_argument('--papermill', action='store_true', help="run the notebooks with papermill, not `fusion-nb reproduce`: for experiments "
                    "that build their own zoo (40), the benchmark's is then not retrained for each seed")
    a = ap.parse_args(argv)
    if 0 in a.seeds: ap.error('seed 0 is the pinned build, always included')
    if a.keep_rows and not a.note: ap.error('--keep-rows needs --note: why those rows still hold for the re-keyed zoo')
    if (bad := [e for e in a.keep_rows if not own_zoo(e)]): ap.error(f"--keep-rows {' '.join(bad)}: not an experiment with a zoo of its own ({', '.join(OWN_ZOO)})")
    keep_rows = sorted({e[:2] for e in a.keep_rows})   # '21' or '21_robust_shifts': the rows are matched by the experiment's number
    if 'FUSION_NB_BUILD_THREADS' in os.environ:   # the thread count is part of the zoo's recipe: seed 0 would be trained, not the pins
        ap.error('unset FUSION_NB_BUILD_THREADS: it changes the zoo recipe, so seed 0 would not be the pinned build')
    import tempfile
    root = a.root or fresh_copy(Path(tempfile.mkdtemp(prefix='build-spread-')))
    print(f"copy: {root}", flush=True)
    runs, total = {}, 0.0
    if a.papermill:   # the pinned benchmark, once
        pinned_build(root, a.profile)
        notebooks = [n for n in sorted((root/'nbs'/'experiments').glob('*.ipynb')) if any(n.stem.startswith(o) for o in a.only)]
    threads = None   # `fusion-nb reproduce` gives its kernels the profile's threads; papermill needs them set, or torch takes the machine's cores
    if a.papermill and 'OMP_NUM_THREADS' not in os.environ:
        from fusion_nb.reproduce.profiles import load_profile
        threads = max(1, int(load_profile(a.profile, root/'settings.ini').cpus_per_experiment))
    if a.keep_pinned and a.papermill: ap.error('--keep-pinned reads the `fusion-nb reproduce` runs (not --papermill)')
    for s in [*a.seeds, *([] if a.keep_pinned else [0])]:   # the pinned build last: the copy is left as the checkout builds it
        env = env_for(root, threads); env.pop('FUSION_NB_BUILD_SEED', None)
        if s: env['FUSION_NB_BUILD_SEED'] = str(s)
        output = root/'spread'/f'seed{s}'
        if a.reuse and (output/a.profile).is_dir() and (missing := unfinished(output/a.profile, experiments(root, a.only))):   # read, it would lose their rows
            print(f"seed {s}: {output/a.profile} holds no finished output of {', '.join(missing)} (a stopped run?): running the seed", flush=True)
        elif a.reuse and (output/a.profile).is_dir():   # the seconds its notebooks recorded
            runs[s] = averages(output/a.profile); total += sum(json.loads(n.read_text())['metadata']['papermill']['duration'] or 0 for n in output.glob('*.ipynb'))
            if not a.papermill:   # `fusion-nb reproduce`'s outputs: the seconds each experiment recorded (its zoo's build is not among them)
                total += sum(json.loads(f.read_text()).get('seconds') or 0 for f in (output/a.profile).glob('*/inputs.json'))
            continue
        if a.papermill:
            wall = 0.0; output.mkdir(parents=True, exist_ok=True)
            for nb in notebooks:
                rc, _, w = run_logged([sys.executable, '-m', 'papermill', '--start-timeout', str(KERNEL_START_TIMEOUT), str(nb), str(output/f'{nb.stem}.ipynb'), '-k', 'python3', '--cwd', str(nb.parent),
                                       '-p', 'profile', a.profile, '-p', 'output_dir', str(output/a.profile/nb.stem)], env, root)
                wall += w
                if rc: print(f"seed {s}: {nb.stem} failed ({rc})"); return rc
        else:
            rc, _, wall = run_logged(cli(root, 'reproduce', '--profile', a.profile, '--only', *a.only, '--force', output_root=output), env, root)
            if rc: print(f"seed {s}: fusion-nb reproduce failed ({rc})"); return rc
        runs[s] = averages(output/a.profile); total += wall
        print(f"seed {s}: {wall:.0f} s", flush=True)
    if (a.reuse or a.keep_pinned) and not a.papermill: pinned_build(root, a.profile)   # seed 0's outputs may have been read, or kept, not built
    manifest = json.loads((root/'data'/a.profile/'manifest.json').read_text())   # the last build: seed 0, the pinned one
    from fusion_nb.core import read_pins
    pinned = read_pins(root/'pins').get(f'{a.profile}/models', {}).get('recipe')
    if pinned and manifest['recipes']['zoo'] != pinned:   # whatever changed the recipe (a setting, the code): the file says seed 0 = the pins
        print(f"seed 0's zoo (recipe {manifest['recipes']['zoo'][:12]}) is not the pinned one ({pinned[:12]}): nothing written"); return 1
    table = spread_table(runs)
    out = a.out or REPO/'data'/'paper_values'/f'build_spread_{a.profile}.csv'
    this_run = (f"python bench/build_spread.py --profile {a.profile} --only {' '.join(a.only)} --seeds {' '.join(map(str, a.seeds))}{' --papermill' if a.papermill else ''}"
                + (f" --keep-rows {' '.join(keep_rows)}" if keep_rows else '') + (' --keep-pinned' if a.keep_pinned else '')
                + (f" (outputs of an earlier run reused: {total:.0f} s of experiments, builds not timed)" if a.reuse and not a.papermill else f" ({total:.0f} s)"))
    recipes, runs_before = {'zoo': manifest['recipes']['zoo']}, []
    llava = sorted((root/'data'/a.profile/'llava').glob('zoo-*/recipe.json'))
    seed0 = [p.parent.name.removeprefix('zoo-') for p in llava if 'seed' not in json.loads(p.read_text())['recipe']]
    if seed0 and any(e.startswith('40') for e in a.only): recipes['llava zoo'] = seed0[0]
    if any(e.startswith(('20', '21')) for e in a.only):   # paper 002's zoo of seed 0: the one the pins hold
        from fusion_nb.robust.zoo import zoo_digest
        recipes['robust zoo'] = zoo_digest(root, a.profile, pinned=True)
    if out.exists():
        table, recipes, runs_before = merge_previous(out, table, recipes, a.only, keep_rows)
        table = table.drop(columns=[c for c in seed_columns(table) if table[c].isna().all()])   # a seed column only the dropped rows (another zoo) filled
    if a.keep_pinned and ('seed 0' not in table.columns or table.loc[table.experiment.isin(set().union(*(runs[s].experiment for s in a.seeds))), 'seed 0'].isna().any()):
        print("--keep-pinned: the file holds no seed 0 for some of this run's rows (another zoo, or not measured): nothing written"); return 1
    header = (f"# build spread, profile {a.profile}: " + ', '.join(f"{k} recipe {v}" for k, v in recipes.items())
              + f" (seed 0 = the pins), training seeds {seeds_in(table)}; runs: " + '; '.join([*runs_before, this_run + (f': {a.note}' if a.note else '')]) + "\n")
    out.write_text(header + table.to_csv(index=False))
    print(table.to_string(index=False)); print(f"\nwritten: {out}")
    return 0

if __name__ == '__main__':
    sys.exit(main())
