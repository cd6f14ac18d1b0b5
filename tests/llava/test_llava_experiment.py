"Paper 004's experiment notebook (40_uq_merge), run with papermill on the `micro` profile (its zoo built on first use), checked against the library."
import json, os, subprocess, sys
from pathlib import Path
import pandas as pd
import pytest

from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.reproduce.reports import ROW_LABELS
from fusion_nb.llava.model import load_llava
from fusion_nb.llava.uncertainty import model_uncertainty
from fusion_nb.llava.uq_merge import draw_selections, merge_llava
from fusion_nb.llava.zoo import ZOO, llava_zoo, zoo_benchmark
from conftest import PAPERMILL

REPO = Path(__file__).resolve().parents[2]
METHODS = ['dare_task_arithmetic', 'della', 'weighted_average', 'ties_merging', 'task_arithmetic', 'model_stock']

@pytest.fixture(scope='module')
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('uq40')
    args = [*PAPERMILL, str(REPO/'nbs'/'experiments'/'40_uq_merge.ipynb'), str(tmp/'run.ipynb'),
            '-k', 'python3', '-p', 'profile', 'micro', '-p', 'output_dir', str(tmp/'out'),
            '-y', 'perturbation_sets: ["image text model", "text"]']   # Table 5: the default set and one rerun (each rerun ~10 s)
    env = {**os.environ, 'FUSION_NB_ROOT': str(REPO), 'HF_HUB_OFFLINE': '1', 'PYTHONPATH': str(REPO)}
    r = subprocess.run(args, env=env, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp/'out'

def micro_setup():
    P = load_profile('micro', settings=REPO/'settings.ini')
    steps, examples = (list(map(int, P.extra[k].split())) for k in ('llava_zoo_steps', 'llava_zoo_examples'))
    recipe = dict(ZOO) | dict(zip(['pretrain_steps', 'general_steps', 'tune_steps'], steps)) | dict(zip(['n_captions', 'n_general', 'n_train'], examples))
    root, manifest = llava_zoo(REPO/'data'/'micro'/'llava', recipe, progress=False)
    held_in, held_out = zoo_benchmark(int(P.extra['llava_n_held_in']), int(P.extra['llava_n_held_out']), seed=P.seed)
    return P, root, manifest, held_in, held_out

def test_tables_have_the_papers_shape(run):
    for n in ['table1', 'table2', 'table3', 'table4', 'table5', 'table6', 'table7', 'table10', 'table11', 'table12', 'figure3', 'figure3_ci',
              'results', 'uq_merge_steps', 'models']:
        assert any((run/f'{n}.{ext}').exists() for ext in ['csv', 'png']), n
    t1, t2 = pd.read_csv(run/'table1.csv', index_col=0), pd.read_csv(run/'table2.csv', index_col=0)
    rows = [ROW_LABELS[m] for m in METHODS] + ['UQ-Merge (ours)', 'Base (all tasks)']
    assert list(t1.index) == rows and list(t2.index) == rows
    held_in = ['ai2d', 'scienceqa', 'seedbench', 'mmbench', 'oodcv']
    held_out = ['okvqa', 'textvqa', 'gqa', 'mmmu', 'vizwiz', 'vqav2', 'pope']
    assert list(t2.columns) == ['avg_held_in', *held_in, 'avg_held_out', *held_out]
    assert t2['avg_held_in'].tolist() == pytest.approx(t2[held_in].mean(axis=1).tolist())
    assert list(pd.read_csv(run/'table3.csv', index_col=[0, 1]).index) == [('Uncertainty', 'Ascending'), ('Uncertainty', 'Descending'),
                                                                             ('Accuracy', 'Ascending'), ('Accuracy', 'Descending')]

def test_uq_merge_keeps_the_lowest_uncertainty_step_and_it_recomputes(run):
    "The selected step is the argmin of the recorded uncertainty; merging its models again and measuring eq. 1 gives that number."
    P, root, manifest, held_in, held_out = micro_setup()
    steps = pd.read_csv(run/'uq_merge_steps.csv')
    ours = steps[steps.run == 'uq_merge'].reset_index(drop=True)
    assert ours.selected.sum() == 1 and ours.uncertainty.idxmin() == ours.index[ours.selected][0]
    summary = json.loads((run/'summary.json').read_text())
    sel = ours[ours.selected].iloc[0]
    assert summary['selected'] == sel.models.split() and summary['k'] == int(sel.step)
    models = pd.read_csv(run/'models.csv')
    order = models[models.run == 'uq_merge'].model.tolist()
    assert order == summary['order'] and models[models.run == 'uq_merge'].uncertainty.is_monotonic_decreasing
    merged = load_llava(merge_llava('linear', {n: root/n for n in summary['selected']}, run.parent/'check'))
    firsts = [sum(len(v) for v in list(held_in.values())[:i]) for i in range(len(held_in))]   # item indices run on across the sets
    per_set = [model_uncertainty(*merged, its, J=int(P.extra['llava_passes']), seed=P.seed, first_index=f).uncertainty
               for its, f in zip(held_in.values(), firsts)]
    assert sum(per_set) / len(per_set) == pytest.approx(sel.uncertainty, abs=1e-6)   # UQ̄: the mean of the held-in sets' means
    t11 = pd.read_csv(run/'table11.csv', index_col=0)
    assert t11[str(int(sel.step))].tolist() == pytest.approx(per_set, abs=1e-6)

def test_table1_baselines_merge_the_same_random_selections(run):
    P, root, manifest, *_ = micro_setup()
    res = pd.read_csv(run/'results.csv')
    rnd = res[(res.part == 'random_selection') & (res.dataset == 'avg_held_in')]
    k = json.loads((run/'summary.json').read_text())['k']
    expected = [' '.join(s) for s in draw_selections(list(manifest['variants']), k, 3, seed=P.seed)]
    for m in METHODS: assert rnd[rnd.method == m].sort_values('selection').models.tolist() == expected
    means = pd.read_csv(run/'table1_mean.csv', index_col=0)
    for m in METHODS: assert means.loc[ROW_LABELS[m], 'avg_held_in'] == pytest.approx(rnd[rnd.method == m].accuracy.mean())

def test_table7_repeats_recompute(run):
    "Table 7: three repeats (seeds P.seed, +1, +2: UQ-Merge's own runs) per model; a model's repeat, measured again per held-in set, gives the table's numbers."
    P, root, manifest, held_in, held_out = micro_setup()
    rep = pd.read_csv(run/'uncertainty_repeats.csv')
    assert set(rep.repeat) == {0, 1, 2} and set(rep.model) == set(manifest['variants'])
    name = sorted(manifest['variants'])[0]
    model, proc = load_llava(root/name)
    got = rep[(rep.model == name) & (rep.repeat == 1)].set_index('dataset').uncertainty
    firsts = [sum(len(v) for v in list(held_in.values())[:i]) for i in range(len(held_in))]
    per_set = {d: model_uncertainty(model, proc, its, J=int(P.extra['llava_passes']), seed=P.seed + 1, first_index=f).uncertainty
               for (d, its), f in zip(held_in.items(), firsts)}
    for d, u in per_set.items(): assert got[d] == pytest.approx(u, abs=1e-9), d
    assert got['average'] == pytest.approx(sum(per_set.values()) / len(per_set), abs=1e-9)   # the mean over sets, not over questions

def test_findings_are_read_from_the_tables(run):
    "The findings cell's verdicts are the tables' comparisons (Table 1 means, Table 3's uncertainty rows, Table 4's steps, the authors' procedure's tables)."
    f = json.loads((run/'summary.json').read_text())['findings']
    t3 = pd.read_csv(run/'table3.csv', index_col=[0, 1])
    assert f['descending_beats_ascending'] == bool(t3.loc[('Uncertainty', 'Descending'), 'avg_held_out'] > t3.loc[('Uncertainty', 'Ascending'), 'avg_held_out'])
    means = pd.read_csv(run/'table1_mean.csv', index_col=0)
    assert f['beats_random_mean'] == all(means.loc['UQ-Merge (ours)', c] > means.loc[ROW_LABELS[m], c] for m in METHODS for c in ['avg_held_in', 'avg_held_out'])
    steps = pd.read_csv(run/'uq_merge_steps.csv')
    ours = steps[steps.run == 'uq_merge']
    better = (ours.avg_held_out > ours[ours.selected].avg_held_out.iloc[0]).sum()
    assert f['lowest_uq_among_top3'] == (better < 3)
    authors = steps[steps.run == 'authors']   # the authors' procedure: the kept step is the one of highest validation accuracy
    assert int(authors[authors.selected].step.iloc[0]) == int(authors.step[authors.validation_accuracy.idxmax()])
    assert f['authors_leave_a_model_out'] == (int(authors[authors.selected].step.iloc[0]) < len(authors))
    a_means = pd.read_csv(run/'table1_authors_mean.csv', index_col=0)
    a_label, others = "UQ-Merge as its authors ran it", [r for r in a_means.index if r != "UQ-Merge as its authors ran it"]
    assert f['authors_beat_random_mean'] == all(a_means.loc[a_label, c] > a_means.loc[r, c] for r in others for c in ['avg_held_in', 'avg_held_out'])
    text = (run/'findings.md').read_text()
    assert text.count('**holds**') == sum(f.values()) and text.count('**does not hold**') == len(f) - sum(f.values()) and len(f) == 5
