"Experiment 10_neulig (paper 001) run with papermill on the real `micro` profile, its tables checked against the library."
import os, subprocess, sys
from pathlib import Path
import pandas as pd
import pytest

from fusion_nb.methods.data import MergeData
from fusion_nb.neulig.neulig import neulig, neulig_records
from fusion_nb.pools import ModelPool, TaskPool, PRETRAINED
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.tiny.tasks import NEULIG_TASKS

REPO = Path(__file__).resolve().parents[1]

@pytest.fixture(scope='module')
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('neulig_experiment')
    out = tmp/'10_neulig'
    args = [sys.executable, '-m', 'papermill', str(REPO/'nbs'/'experiments'/'10_neulig.ipynb'), str(tmp/'run.ipynb'),
            '-k', 'python3', '-p', 'profile', 'micro', '-p', 'output_dir', str(out)]
    r = subprocess.run(args, env={**os.environ, 'FUSION_NB_ROOT': str(REPO), 'HF_HUB_OFFLINE': '1'}, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return out

def test_table_layout_and_arithmetic(run):
    table = pd.read_csv(run/'table.csv', header=[0, 1], index_col=0)
    assert list(table.columns.get_level_values(0).unique()) == [*NEULIG_TASKS, 'Avg.']
    assert set(table.columns.get_level_values(1)) == {'Mer.', 'Ens.', 'Gap'}
    assert list(table.index) == ['Pre-trained', 'Fine-tuned', 'Simple Averaging', 'Task Arithmetic (λ=0.3)',
                                 'NeuLig (Semi-Supervised)', 'NeuLig (Supervised)']
    neu = table.loc[['NeuLig (Semi-Supervised)', 'NeuLig (Supervised)', 'Simple Averaging']]
    for t in NEULIG_TASKS:
        assert (neu[(t, 'Gap')] - (neu[(t, 'Mer.')] - neu[(t, 'Ens.')]).abs()).abs().max() < 1e-9
    assert (neu[('Avg.', 'Mer.')] - neu.xs('Mer.', axis=1, level=1)[NEULIG_TASKS].mean(axis=1)).abs().max() < 1e-9
    s9 = pd.read_csv(run/'table_s9.csv', index_col=0)
    assert list(s9.index) == ['Mer.', 'Ens.', 'Gap'] and [float(c) for c in s9.columns] == [0.1, 1.0]   # micro: neulig_data_scales
    for f in ('figure_s8.png', 'figure_s8.pdf', 'figure_s9.png', 'figure_s9.pdf', 'table_s7.csv', 'results.csv', 'map_diagonal.csv'):
        assert (run/f).exists(), f

def test_saved_portland_reproduces_the_rows_without_training(run):
    "The artefacts reload (no training) and give the table's NeuLig numbers, per-sample and with the CoopVec Map."
    P = prepare(load_profile('micro', tasks=NEULIG_TASKS))
    models, tasks = ModelPool.from_profile(P), TaskPool.from_profile(P)
    data = MergeData(models, tasks, seed=P.seed)
    pre, experts = models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in P.tasks}
    s7 = pd.read_csv(run/'table_s7.csv', header=[0, 1], index_col=0)
    m = neulig(pre, experts, data=data, load_from=run/'artefacts'/'neulig_semi-supervised.portland.safetensors')
    assert m.neulig_info['steps'] == 3   # micro: neulig_steps
    for use_map, row in [(False, 'NeuLig (Semi-Supervised)'), (True, 'NeuLig (Semi-Supervised), CoopVec Map')]:
        rec = neulig_records(m, data, use_map=use_map, batch_size=P.batch_size, seed=P.seed, progress=False)
        acc = rec[rec.metric == 'accuracy'].pivot(index='level', columns='task', values='value') * 100
        assert acc.loc['merge', NEULIG_TASKS].tolist() == pytest.approx(s7.loc[row].xs('Mer.', level=1)[NEULIG_TASKS].tolist())
        assert acc.loc['ensemble', NEULIG_TASKS].tolist() == pytest.approx(s7.loc[row].xs('Ens.', level=1)[NEULIG_TASKS].tolist())
    diag = pd.read_csv(run/'map_diagonal.csv')
    last = diag[(diag.setting == 'semi-supervised') & (diag.step == diag.step.max())].set_index('dataset')['diagonal']
    assert last.to_dict() == pytest.approx({t: m.coopvec_map.loc[t, t] for t in NEULIG_TASKS}, abs=1e-6)
