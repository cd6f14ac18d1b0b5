"Issue 5's experiment notebooks, run with papermill on the micro project, checked against the library."
import os, subprocess, sys
import pandas as pd
import pytest, torch

from fusion_nb.algebra import TaskVector, cosine
from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.pools import ModelPool, PRETRAINED
from conftest import PAPERMILL

def run_nb(micro_project, tmp_path, name, *params):
    out = tmp_path/name
    args = [*PAPERMILL, str(micro_project/'nbs'/'experiments'/f'{name}.ipynb'), str(tmp_path/f'{name}.run.ipynb'),
            '-k', 'python3', '-p', 'profile', 'micro-test', '-p', 'output_dir', str(out), *params]
    r = subprocess.run(args, env={**os.environ, 'FUSION_NB_ROOT': str(micro_project)}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return out

def test_multi_task_table_single_method_row(micro_project, tmp_path):
    out = run_nb(micro_project, tmp_path, '01_multi_task_merging', '-p', 'method', 'ties_merging', '-p', 'scaling_factor', '0.5')
    table = pd.read_csv(out/'table_ties_merging.csv', index_col=0)
    assert list(table.index) == ['Ties-Merging'] and list(table.columns) == ['shapes', 'colors', 'Avg.']
    rec = pd.read_csv(out/'results_ties_merging.csv')
    assert set(rec['method']) == {'ties_merging'} and "'scaling_factor': 0.5" in rec['hparams'].iloc[0]

def test_multi_task_table_all_rows(micro_project, tmp_path):
    out = run_nb(micro_project, tmp_path, '01_multi_task_merging')
    table = pd.read_csv(out/'table.csv', index_col=0)
    assert list(table.index) == ['Pre-trained', 'Fine-tuned (STL)', 'Simple Averaging', 'Task Arithmetic', 'Ties-Merging',
                                 'DARE (TA)', 'DELLA', 'Model Stock']
    # each method's own ensemble (paper 001's Ens.) and gap; tests/neulig/test_merge_vs_ensemble.py checks the numbers
    gap = abs(table.loc['Simple Averaging', 'Avg.'] - table.loc['Simple Averaging', 'Ens. (Avg.)'])
    assert table.loc['Simple Averaging', 'Gap (Avg.)'] == pytest.approx(gap)
    assert (out/'average_accuracy.png').exists()
    # beyond paper 000: every training-free sota row (NuSLERP too: two experts here), none with a same-weights ensemble
    from fusion_nb.reproduce.sota import sota_rows
    from fusion_nb.reproduce.reports import ROW_LABELS
    beyond = pd.read_csv(out/'table_beyond.csv', index_col=0)
    assert list(beyond.index) == [ROW_LABELS[r] for r in sota_rows(2, kinds=('training-free',), root=micro_project)] and 'NuSLERP' in beyond.index
    assert beyond['Ens. (Avg.)'].isna().all() and beyond['Avg.'].between(0, 100).all()

def test_scaling_sweep(micro_project, tmp_path):
    out = run_nb(micro_project, tmp_path, '02_scaling_sweeps', '-y', 'lambdas: [0.0, 0.5]')
    sweep = pd.read_csv(out/'table.csv', index_col=0)
    assert list(sweep.index) == ['task_arithmetic', 'ties_merging'] and list(sweep.columns) == ['λ=0', 'λ=0.5']
    # λ = 0 is the pretrained model for both methods
    assert sweep.loc['task_arithmetic', 'λ=0'] == pytest.approx(sweep.loc['ties_merging', 'λ=0'])
    assert (out/'scaling_sweeps.png').exists()

def test_task_vector_cosine(micro_project, tmp_path):
    out = run_nb(micro_project, tmp_path, '03_task_vector_cosine')
    sim = pd.read_csv(out/'table.csv', index_col=0)
    p = load_profile('micro-test', settings=micro_project/'settings.ini')
    mp = ModelPool.from_profile(p)
    pre = mp.vision_state(PRETRAINED)
    a, b = (TaskVector.from_models(pre, mp.vision_state(t)) for t in ['shapes', 'colors'])
    flat = lambda tv: torch.cat([tv[k].double().flatten() for k in sorted(tv)])
    ref = float(torch.nn.functional.cosine_similarity(flat(a), flat(b), dim=0))
    assert sim.loc['shapes', 'colors'] == pytest.approx(ref, abs=1e-6) and sim.loc['colors', 'colors'] == 1.0

def test_every_evaluation_takes_the_profiles_autocast():
    "The profile key `autocast` is not dead: every evaluation an experiment runs on the profile's test budget passes it on."
    import json, re
    from pathlib import Path
    calls = []
    for nb in sorted(Path(__file__).parents[2].glob('nbs/experiments/*.ipynb')):
        for c in json.loads(nb.read_text())['cells']:
            src = ''.join(c['source'])
            # direct calls, and the keyword dicts (`EVAL = dict(...)`) that calls splat in
            for m in re.finditer(r'\b(evaluate|merge_ensemble_gap|evaluate_routed|neulig_records|dict)\((?:[^()]|\([^()]*\))*\)', src):
                if 'max_samples=P.max_test_samples' in m.group(0): calls.append((nb.name, m.group(0)))
    assert len(calls) >= 6
    # paper 003's evaluations on the test sets (30, 31) take the whole test set or max_test_samples when loading it
    for nb in sorted(Path(__file__).parents[2].glob('nbs/experiments/3*.ipynb')):
        for c in json.loads(nb.read_text())['cells']:
            calls += [(nb.name, m.group(0)) for m in re.finditer(r'\b(evaluate_id_ood|feature_drift)\((?:[^()]|\([^()]*\))*\)', ''.join(c['source']))]
    assert {n for n, c in calls if 'evaluate_id_ood' in c} == {'30_masked_images.ipynb', '31_masked_images_comparison.ipynb'}
    assert any(n == '30_masked_images.ipynb' and c.startswith('feature_drift') for n, c in calls)
    missing = [f'{n}: {c[:80]}' for n, c in calls if 'autocast=P.autocast' not in c]
    assert not missing, missing
