"""Experiments 20_robust_fronts and 21_robust_shifts (paper 002), run with papermill on the micro profile, checked
against independent computations: plain state-dict soups, plain APGD calls, plain argmax accuracies."""
import os, subprocess, sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.robust.attacks import apgd
from fusion_nb.robust.models import convnet
from fusion_nb.robust.shifts import SHIFTS, shift_tensors, shifts_dir
from fusion_nb.robust.zoo import load_zoo, standin, standin_attacks, zoo_dir
from conftest import PAPERMILL

REPO = Path(__file__).resolve().parents[2]

def run_nb(tmp_path, name, *params):
    out = tmp_path/name
    args = [*PAPERMILL, str(REPO/'nbs'/'experiments'/f'{name}.ipynb'), str(tmp_path/f'{name}.run.ipynb'),
            '-k', 'python3', '-p', 'profile', 'micro', '-p', 'output_dir', str(out), *params]
    env = {**os.environ, 'FUSION_NB_ROOT': str(REPO), 'HF_HUB_OFFLINE': '1', 'PYTHONPATH': str(REPO)}
    r = subprocess.run(args, env=env, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return out

def soup_of(models, weights):
    "Σ wᵢ θᵢ written out tensor by tensor (BatchNorm's step counter: the first model's)."
    sds = [models[n].state_dict() for n in weights]
    out = {k: sum(w * sd[k] for w, sd in zip(weights.values(), sds)) if sds[0][k].is_floating_point() else sds[0][k] for k in sds[0]}
    m = convnet(models[next(iter(weights))][0].out_channels, 12); m.load_state_dict(out); return m.eval()

@pytest.fixture(scope='module')
def shifts_run(tmp_path_factory):
    return run_nb(tmp_path_factory.mktemp('r21'), '21_robust_shifts', '-p', 'radii', 'True')

def test_table1_rows_recomputed(shifts_run):
    P = load_profile('micro', settings=REPO/'settings.ini')
    zoo = load_zoo(zoo_dir(REPO, 'micro', 'imagenet'))
    t1 = pd.read_csv(shifts_run/'table1.csv', index_col=[0, 1, 2])
    cols = list(SHIFTS.values())
    assert list(t1.columns) == [*cols, 'MEAN'] and t1['MEAN'].tolist() == pytest.approx(t1[cols].mean(axis=1).tolist())
    test = {s: shift_tensors(shifts_dir(REPO, 'micro'), s, 'test') for s in SHIFTS}
    def acc(model):
        with torch.no_grad(): return [100 * float(a[torch.arange(len(y)), model(x).argmax(1)].float().mean()) for x, y, a, _ in test.values()]
    row = t1.xs('Adversarial training (θ∞)', level='setup').iloc[0]
    assert row[cols].tolist() == pytest.approx(acc(zoo['theta_linf']))
    # the single soup: the grid point with the best mean adapt accuracy (results.csv), rebuilt by hand, on the test splits
    res = pd.read_csv(shifts_run/'results.csv')
    mean = res[(res.radii == 'ε') & (res['shift'] == 'MEAN')].sort_values('soup')
    best = mean.loc[mean.value.idxmax()]   # idxmax: the first maximum, in grid order
    names = {'θ∞': 'theta_linf', 'θ∞→2': 'theta_linf_to_l2', 'θ∞→1': 'theta_linf_to_l1', 'θ∞→nominal': 'theta_linf_to_nominal'}
    soup = soup_of(zoo, {n: float(best[k]) for k, n in names.items()})
    assert t1.xs('Single soup', level='setup').iloc[0][cols].tolist() == pytest.approx(acc(soup), abs=1e-4)
    assert len(mean) == 480   # the affine grid [−0.4, 1.4], step 0.2, of four models

def test_top_soups_and_radii_tables(shifts_run):
    t1 = pd.read_csv(shifts_run/'table1.csv', index_col=[0, 1, 2]); t2 = pd.read_csv(shifts_run/'table2.csv', index_col=[0, 1])
    t3 = pd.read_csv(shifts_run/'table3.csv', index_col=[0, 1])
    for kind, setup in [('single', 'Single soup'), ('dataset-specific', 'Dataset-specific soups')]:
        assert t2.loc[('1st best', kind)].tolist() == pytest.approx(t1.xs(setup, level='setup').iloc[0].tolist())
        assert t3.loc[('robust models at ε', kind)].tolist() == pytest.approx(t1.xs(setup, level='setup').iloc[0].tolist())
    assert {r for r, _ in t3.index} == {'robust models at ε', 'robust models at ε/2', 'robust models at ε/4'}
    f8 = pd.read_csv(shifts_run/'figure8.csv', index_col=0)
    assert (f8.drop(columns='best possible').le(f8['best possible'] + 1e-9, axis=0)).all().all()   # selection never beats the oracle
    for f in ['figure6', 'figure7', 'figure8', 'figure9', 'figure11']: assert (shifts_run/f'{f}.png').exists() and (shifts_run/f'{f}.pdf').exists()

def test_fronts_endpoints_recomputed(tmp_path):
    out = run_nb(tmp_path, '20_robust_fronts')
    P = load_profile('micro', settings=REPO/'settings.ini')
    n, steps = int(P.extra['robust_eval_images']), int(P.extra['robust_eval_steps'])
    fig5 = pd.read_csv(out/'table_fig5.csv', index_col=0)
    for ds in ('cifar10', 'imagenet'):
        m = load_zoo(zoo_dir(REPO, 'micro', ds))['theta_linf']; x, y = standin(ds, 'test', n)
        a = next(a for a in standin_attacks(ds, steps=steps) if a['norm'] == 'linf')
        with torch.no_grad(): clean = m(x).argmax(1) == y
        ok = torch.zeros_like(clean)
        if clean.any(): ok[clean] = apgd(m, x[clean], y[clean], 'linf', a['eps'], steps=steps, loss=a['loss']).robust
        assert fig5.loc[1.0, ds] == pytest.approx(100 * float(ok.float().mean()))   # w = 1 is θ∞ itself
    fronts = pd.read_csv(out/'table_fronts.csv', index_col=[0, 1, 2])
    assert fronts.loc[('cifar10', 'θlinf→θlinf→l2', 'linf'), 'w=1'] == pytest.approx(fig5.loc[1.0, 'cifar10'])
    simplex = pd.read_csv(out/'table_simplex.csv', index_col=[0, 1, 2])
    grid = simplex.dropna(subset=['best single ingredient'])
    assert len(grid) and (grid['best soup'] >= grid['best single ingredient'] - 1e-9).all()   # a corner is a soup of the grid
    for f in ['figure1', 'figure2', 'figure3', 'figure4', 'figure5']: assert (out/f'{f}.png').exists()

@pytest.mark.parametrize('name', ['20_robust_fronts', '21_robust_shifts'])
def test_paper_profile_names_the_missing_checkpoints(tmp_path, name):
    "The paper-002 profile trains nothing: offline, without the user's TorchScript files and test sets, both experiments stop at once, naming them all."
    P = load_profile('robust-soups', settings=REPO/'settings.ini')
    assert P.experiments == ['20', '21'] and P.extra['robust_simplex_attack'] == 'strong'
    args = [*PAPERMILL, str(REPO/'nbs'/'experiments'/f'{name}.ipynb'), str(tmp_path/'run.ipynb'), '-k', 'python3',
            '-p', 'profile', 'robust-soups', '-p', 'output_dir', str(tmp_path/'out'), '-p', 'device', 'cpu']
    env = {**os.environ, 'FUSION_NB_ROOT': str(REPO), 'HF_HUB_OFFLINE': '1', 'PYTHONPATH': str(REPO)}
    r = subprocess.run(args, env=env, capture_output=True, text=True, cwd=REPO)
    assert r.returncode != 0
    assert 'paper-scale robust models missing' in r.stderr and 'No such file: theta_linf=' in r.stderr, r.stderr[-2000:]
    first = 'cifar10' if name.startswith('20') else 'imagenet'   # the first dataset the experiment needs
    assert f"theta_linf={REPO}/data/paper002/{first}/theta_linf.pt" in r.stderr
    # every test set the experiment reads is named, with what to do, before any work (no output folder written)
    from fusion_nb.robust.paper_data import EXPERIMENT_TASKS
    for t in EXPERIMENT_TASKS[name[:2]]: assert f"\n  - {t}: " in r.stderr, (t, r.stderr[-3000:])
    assert "It is gated" in r.stderr and not (tmp_path/'out').exists()
