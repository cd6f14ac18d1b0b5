"Experiment 10_neulig (paper 001) run with papermill on the real `micro` profile, its tables checked against the library."
import os, subprocess, sys
from pathlib import Path
import pandas as pd
import pytest

from fusion_nb.evaluation import evaluate
from fusion_nb.merge import ensemble, simple_average, task_arithmetic, ties_merging
from fusion_nb.methods.data import MergeData
from fusion_nb.neulig.neulig import neulig, neulig_records
from fusion_nb.pools import ModelPool, TaskPool, PRETRAINED
from fusion_nb.reproduce.profiles import load_profile, prepare
from fusion_nb.tiny.tasks import NEULIG_TASKS
from conftest import PAPERMILL

REPO = Path(__file__).resolve().parents[2]

@pytest.fixture(scope='module')
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('neulig_experiment')
    out = tmp/'10_neulig'
    args = [*PAPERMILL, str(REPO/'nbs'/'experiments'/'10_neulig.ipynb'), str(tmp/'run.ipynb'),
            '-k', 'python3', '-p', 'profile', 'micro', '-p', 'output_dir', str(out)]
    r = subprocess.run(args, env={**os.environ, 'FUSION_NB_ROOT': str(REPO), 'HF_HUB_OFFLINE': '1'}, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return out

# Table s5's rows as paper 001 prints them (AdaMerging filed as layer-wise AdaMerging, WeMoE as WE-MoE)
BASELINES = ['Simple Averaging', 'Task Arithmetic', 'Ties-Merging', 'RegMean', 'Layer-wise AdaMerging', 'Weight-Ensembling MoE']
NO_ENSEMBLE = ['Ties-Merging', 'RegMean']
NEULIG = ['NeuLig (Semi-Supervised)', 'NeuLig (Supervised)']
ROWS = ['Pre-trained', 'Fine-tuned', *BASELINES, *NEULIG]

@pytest.fixture(scope='module')
def table(run): return pd.read_csv(run/'table.csv', header=[0, 1], index_col=0)

def test_table_layout_and_arithmetic(run, table):
    assert list(table.columns.get_level_values(0).unique()) == [*NEULIG_TASKS, 'Avg.']
    assert set(table.columns.get_level_values(1)) == {'Mer.', 'Ens.', 'Gap'}
    assert list(table.index) == ROWS
    assert table.xs('Mer.', axis=1, level=1).notna().all().all()
    with_ens = [r for r in ROWS[2:] if r not in NO_ENSEMBLE]
    assert table.loc[with_ens].notna().all().all()
    assert table.loc[['Pre-trained', 'Fine-tuned', *NO_ENSEMBLE], (slice(None), ['Ens.', 'Gap'])].isna().all().all()
    for t in NEULIG_TASKS:   # Gap = |Mer. − Ens.| on every row with an ensemble
        assert ((table.loc[with_ens, (t, 'Gap')] - (table.loc[with_ens, (t, 'Mer.')] - table.loc[with_ens, (t, 'Ens.')]).abs()).abs() < 1e-9).all()
    mer, ens = table.xs('Mer.', axis=1, level=1), table.xs('Ens.', axis=1, level=1)
    assert (mer['Avg.'] - mer[NEULIG_TASKS].mean(axis=1)).abs().max() < 1e-9
    assert (ens.loc[with_ens, 'Avg.'] - ens.loc[with_ens, NEULIG_TASKS].mean(axis=1)).abs().max() < 1e-9
    assert (table.loc[with_ens, ('Avg.', 'Gap')] - (mer['Avg.'] - ens['Avg.']).loc[with_ens].abs()).abs().max() < 1e-9   # |Avg. Mer. − Avg. Ens.|
    s9 = pd.read_csv(run/'table_s9.csv', index_col=0)
    assert list(s9.index) == ['Mer.', 'Ens.', 'Gap'] and [float(c) for c in s9.columns] == [0.1, 1.0]   # micro: neulig_data_scales
    for f in ('figure_s8.png', 'figure_s8.pdf', 'figure_s9.png', 'figure_s9.pdf', 'table_s7.csv', 'results.csv', 'map_diagonal.csv',
              'artefacts/layer_wise_adamerging.safetensors', 'artefacts/weight_ensembling_moe.routers.safetensors'):
        assert (run/f).exists(), f

def test_printed_table_shows_a_dash_where_no_ensemble(run, table):
    printed = pd.read_csv(run/'table_printed.csv', header=[0, 1], index_col=0, keep_default_na=False, dtype=str)
    assert list(printed.index) == ROWS
    for r in NO_ENSEMBLE:
        assert set(printed.loc[r, (slice(None), ['Ens.', 'Gap'])]) == {'–'}, r
    assert set(printed.loc[['Pre-trained', 'Fine-tuned'], (slice(None), ['Ens.', 'Gap'])].values.ravel()) == {''}
    assert '–' not in printed.loc[[r for r in ROWS[2:] if r not in NO_ENSEMBLE]].values
    assert printed.loc['RegMean', ('Avg.', 'Mer.')] == f"{table.loc['RegMean', ('Avg.', 'Mer.')]:.1f}"
    # paper 001's "(+x.xx)": NeuLig's Avg. minus the best baseline's (Mer., Ens.) or the smallest baseline Gap, by hand
    avg, base = table['Avg.'], [r for r in BASELINES]
    with_ens = [b for b in base if avg.notna().loc[b, 'Ens.']]
    for r in NEULIG:
        want = {'Mer.': avg.loc[r, 'Mer.'] - max(avg.loc[b, 'Mer.'] for b in base), 'Ens.': avg.loc[r, 'Ens.'] - max(avg.loc[b, 'Ens.'] for b in with_ens),
                'Gap': avg.loc[r, 'Gap'] - min(avg.loc[b, 'Gap'] for b in with_ens)}
        for m, d in want.items(): assert printed.loc[r, ('Avg.', m)] == f"{avg.loc[r, m]:.1f} ({d:+.1f})", (r, m)

def test_finding_compares_neulig_with_every_baseline(run, table):
    finding = pd.read_csv(run/'finding.csv', index_col=0)
    assert list(finding.index) == NEULIG
    avg = table['Avg.']
    for r in NEULIG:
        assert finding.loc[r, 'Mer. above every baseline Mer.'] == all(avg.loc[r, 'Mer.'] > avg.loc[b, 'Mer.'] for b in BASELINES)
        assert finding.loc[r, 'Gap below every baseline Gap'] == all(avg.loc[r, 'Gap'] < avg.loc[b, 'Gap'] for b in BASELINES if b not in NO_ENSEMBLE)
        above = [b for b in BASELINES if avg.loc[b, 'Mer.'] >= avg.loc[r, 'Mer.']]
        assert finding.loc[r, 'baselines at or above in Mer.'] == (', '.join(above) or 'none')

def test_baseline_rows_match_an_independent_evaluation(run, table):
    "Simple Averaging (merged, and its uniform logit ensemble), Task Arithmetic and TIES merged, Fine-tuned: built and evaluated here without `fuse`/`merge_ensemble_gap`."
    P = prepare(load_profile('micro', tasks=NEULIG_TASKS))
    models, tasks = ModelPool.from_profile(P), TaskPool.from_profile(P)
    pre, experts = models.vision_state(PRETRAINED), {t: models.vision_state(t) for t in P.tasks}
    built = {'Simple Averaging': simple_average(pre, experts, progress=False),
             'Simple Averaging, ensemble': ensemble(pre, experts, combine='logits'),
             'Task Arithmetic': task_arithmetic(pre, experts, scaling_factor=0.3, progress=False),   # paper 001's λ
             'Ties-Merging': ties_merging(pre, experts, k=20, scaling_factor=0.3, trim_scope='model', disjoint='sum', progress=False),
             **{f'Fine-tuned:{t}': t for t in NEULIG_TASKS}}
    per_task = {k: [k.split(':')[1]] if k.startswith('Fine-tuned:') else NEULIG_TASKS for k in built}
    got = evaluate(built, models, tasks, per_task, batch_size=P.batch_size, max_samples=P.max_test_samples, seed=P.seed, progress=False)
    acc = got[got.metric == 'accuracy'].set_index(['model', 'task'])['value'] * 100
    for t in NEULIG_TASKS:
        for row in ('Simple Averaging', 'Task Arithmetic', 'Ties-Merging'):
            assert table.loc[row, (t, 'Mer.')] == pytest.approx(acc[row, t]), (row, t)
        assert table.loc['Simple Averaging', (t, 'Ens.')] == pytest.approx(acc['Simple Averaging, ensemble', t]), t
        assert table.loc['Fine-tuned', (t, 'Mer.')] == pytest.approx(acc[f'Fine-tuned:{t}', t]), t

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

def test_table_s8_rows_reload_from_the_saved_portland_and_the_half_zoo(run):
    "Table s8's last epoch: the saved Portland (trained over the model-As) loaded onto the As and onto the Bs, evaluated here, gives its rows."
    from fusion_nb.neulig.half_zoo import HALVES, half_zoo_dir
    s8 = pd.read_csv(run/'table_s8.csv', index_col=[0, 1])
    assert [tuple(i) for i in s8.index] == [('Ori.', 'Mer.'), ('Ori.', 'Ens.'), ('Trans.', 'Mer.'), ('Trans.', 'Ens.')]
    assert [int(c) for c in s8.columns] == [1, 2]   # micro: neulig_transfer_epochs
    P = prepare(load_profile('micro', tasks=NEULIG_TASKS))
    models, tasks = ModelPool.from_profile(P), TaskPool.from_profile(P)
    data = MergeData(models, tasks, seed=P.seed)
    pre = models.vision_state(PRETRAINED)
    folder = half_zoo_dir(P.root, P.name)
    for h, group in zip(HALVES, ('Ori.', 'Trans.')):
        experts = {t: ModelPool(models.pretrained, {t: folder/f'{t}_{h}'}).vision_state(t) for t in NEULIG_TASKS}
        m = neulig(pre, experts, data=data, load_from=run/'artefacts'/'neulig_transfer_model-A.portland.safetensors')
        rec = neulig_records(m, data, batch_size=P.batch_size, seed=P.seed, progress=False)
        acc = rec[rec.metric == 'accuracy'].groupby('level')['value'].mean() * 100
        assert acc['merge'] == pytest.approx(s8.loc[(group, 'Mer.'), '2']) and acc['ensemble'] == pytest.approx(s8.loc[(group, 'Ens.'), '2'])

def test_findings_are_read_from_the_tables(run, table):
    findings = pd.read_csv(run/'findings.csv', index_col=0)
    finding = pd.read_csv(run/'finding.csv', index_col=0)
    for r in NEULIG:
        assert findings.loc[f"{r}: Avg. Gap below every baseline's (Table s5)", 'holds here'] == finding.loc[r, 'Gap below every baseline Gap']
        assert findings.loc[f"{r}: Avg. Mer. above every baseline's (Table s5)", 'holds here'] == finding.loc[r, 'Mer. above every baseline Mer.']
        assert f"{table.loc[r, ('Avg.', 'Mer.')]:.2f}" in findings.loc[f"{r}: Avg. Mer. above every baseline's (Table s5)", 'this run']
    s8 = pd.read_csv(run/'table_s8.csv', index_col=[0, 1])
    diff = (s8.loc[('Ori.', 'Mer.')] - s8.loc[('Trans.', 'Mer.')]).abs().max()
    row = findings.loc["Portland transferred to model-Bs: Avg. Mer. within 2 points of the As' at every epoch (Table s8)"]
    assert row['holds here'] == (diff <= 2) and f'{diff:.2f}' in row['this run']
    assert abs(row['difference (points)'] - (2 - diff)) < 1e-9
    # each claim's margin, from table s5 alone: positive exactly when the claim holds
    avg = table['Avg.']
    for r in NEULIG:
        gap = findings.loc[f"{r}: Avg. Gap below every baseline's (Table s5)"]
        mer = findings.loc[f"{r}: Avg. Mer. above every baseline's (Table s5)"]
        assert abs(gap['difference (points)'] - (avg.loc[[b for b in BASELINES if b not in NO_ENSEMBLE], 'Gap'].min() - avg.loc[r, 'Gap'])) < 1e-9
        assert abs(mer['difference (points)'] - (avg.loc[r, 'Mer.'] - avg.loc[BASELINES, 'Mer.'].max())) < 1e-9
    assert (findings['holds here'] == (findings['difference (points)'] > 0)).all()
    assert pd.read_csv(run/'routing.csv', index_col=0).index.tolist() == NEULIG

def test_table_s6_is_the_five_task_table_of_each_backbone(run):
    "Table s6 per backbone: the second backbone's rows are its own models' (pre-trained, experts, task arithmetic of its experts)."
    from fusion_nb.neulig.second_backbone import backbone_accuracy, backbone_profile, profile_backbones
    five = NEULIG_TASKS[:5]
    P = load_profile('micro', tasks=five)
    names = profile_backbones(P)
    assert len(names) == 2 and names[0] != names[1]
    tables = {n: pd.read_csv(run/f'table_s6_{n}.csv', index_col=0, header=[0, 1]) for n in names}
    for n, t in tables.items():
        assert list(t.index) == ROWS and list(t.columns.get_level_values(0).unique()) == [*five, 'Avg.']
    t = tables[names[1]]
    ref = backbone_accuracy(P, 1)   # evaluate() of backbone 1's pre-trained model and experts, nothing else shared
    for row in ['Pre-trained', 'Fine-tuned']:
        for task in five: assert float(t.loc[row, (task, 'Mer.')]) == pytest.approx(ref.loc[row, task], abs=1e-6)
    P1 = backbone_profile(P, 1)
    models, tasks = ModelPool.from_profile(P1), TaskPool.from_profile(P1)
    pre, experts = models.vision_state(PRETRAINED), {x: models.vision_state(x) for x in five}
    ta = task_arithmetic(pre, experts, scaling_factor=0.3, progress=False)
    acc = evaluate({'ta': ta}, models, tasks, five, batch_size=P.batch_size, max_samples=P.max_test_samples, seed=P.seed, progress=False)
    acc = acc[acc['metric'] == 'accuracy'].set_index('task')['value'] * 100
    for task in five: assert float(t.loc['Task Arithmetic', (task, 'Mer.')]) == pytest.approx(acc[task], abs=1e-6)
    assert not tables[names[0]].loc['Fine-tuned'].equals(t.loc['Fine-tuned']) or not tables[names[0]].loc['Pre-trained'].equals(t.loc['Pre-trained'])

def test_routing_confusion_rows_and_diagonal(run):
    "Each dataset's row of the routing confusion sums to 100 %, and its sample-weighted diagonal is the routing table's own-expert share."
    conf = pd.read_csv(run/'routing_confusion.csv', index_col=[0, 1])
    routing = pd.read_csv(run/'routing.csv', index_col=0)
    for setting in NEULIG:
        c = conf.loc[setting]
        assert list(c.index) == NEULIG_TASKS and list(c.columns) == NEULIG_TASKS
        assert (c.sum(axis=1) - 100).abs().max() < 1e-6
        # every dataset has the same number of visible samples on micro, so the mean of the diagonal is the overall share
        assert sum(c.loc[t, t] for t in NEULIG_TASKS) / len(NEULIG_TASKS) == pytest.approx(routing.loc[setting, 'own expert largest weight (% of samples)'])
