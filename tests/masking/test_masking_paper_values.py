"""Paper 003's transcribed values (data/paper_values/paper003.csv): schema, completeness, and internal consistency.

Every check can fail on a transcription slip: each printed OOD average must be the mean of its five OOD cells (up
to the paper's one-decimal rounding), the rows tables 1 and 3 share must agree, the cells the paper prints in bold
must be the best of their columns, and table 2's masking rates must grow as the CAM threshold falls.
"""
import pandas as pd
import pytest

from fusion_nb.masking.masks import MASKINGS, REFILLS
from fusion_nb.reproduce.profiles import list_profiles, load_profile
from fusion_nb.reproduce.reports import load_paper_values

COLUMNS = ['paper', 'table', 'model', 'method', 'task', 'metric', 'value']
KEY = ['table', 'model', 'method', 'task', 'metric']
ID, OOD = 'imagenet', ['imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a']
TASKS = [ID, *OOD, 'ood_avg']
MODELS = {'clip-vit-b32-imagenet', 'clip-vit-b16-imagenet'}
BASELINES = {'zero_shot', 'vanilla_ft', 'lp_ft', 'wise_ft', 'uniform_soup'}
STRATEGIES = ['ours:none'] + [f'ours:{m}:{r}' for r in REFILLS for m in MASKINGS if m != 'none']   # table 1's order
THRESHOLDS = [0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
ROUNDING = 0.1 + 1e-9   # five one-decimal cells and their one-decimal mean: at most 0.05 + 0.05 apart
# The bold-faced (best) cell of each column, as printed: (table id, model, task) → method
BOLD = {**{('masking_refilling', 'clip-vit-b32-imagenet', t): 'ours:object:single' for t in OOD[1:] + ['ood_avg']},
        ('masking_refilling', 'clip-vit-b32-imagenet', ID): 'ours:context:multi',
        ('masking_refilling', 'clip-vit-b32-imagenet', 'imagenet_v2'): 'ours:object:multi',
        **{('comparison', 'clip-vit-b32-imagenet', t): 'uniform_soup' for t in (ID, 'imagenet_v2', 'imagenet_sketch')},
        ('comparison', 'clip-vit-b32-imagenet', 'imagenet_r'): 'wise_ft',
        **{('comparison', 'clip-vit-b32-imagenet', t): 'ours:object:single' for t in ('objectnet', 'imagenet_a', 'ood_avg')},
        ('comparison', 'clip-vit-b16-imagenet', ID): 'ours:object:multi',
        ('comparison', 'clip-vit-b16-imagenet', 'imagenet_v2'): 'ours:object:single',
        **{('comparison', 'clip-vit-b16-imagenet', t): 'wise_ft' for t in ('imagenet_r', 'imagenet_sketch')},
        **{('comparison', 'clip-vit-b16-imagenet', t): 'ours:object:single' for t in ('objectnet', 'imagenet_a', 'ood_avg')}}

@pytest.fixture(scope='module')
def pv():
    v = load_paper_values()
    v = v[v['paper'].astype(str).str.zfill(3) == '003']
    return v.assign(tid=v['table'].str.split(':').str[0])

def acc(pv, tid, model):
    "The accuracy table `tid` of `model` as methods × tasks, rows in file order."
    a = pv[(pv['tid'] == tid) & (pv['model'] == model) & (pv['metric'] == 'accuracy')]
    return a.pivot(index='method', columns='task', values='value').reindex(index=list(dict.fromkeys(a['method'])), columns=TASKS)

def test_schema_and_names(pv):
    raw = pd.read_csv(load_profile('tiny').root/'data'/'paper_values'/'paper003.csv', dtype=str)
    assert list(raw.columns) == COLUMNS and not raw.isna().any().any() and set(raw['paper']) == {'003'}
    assert len(raw) == len(pv) == 12 * 7 + 6 * 3 + 6 * 7 + 6 * 7 - 2   # B/16's LP-FT has no ObjectNet and so no OOD avg.
    assert set(pv['tid']) == {'masking_refilling', 'cam_validation', 'comparison'}
    assert (pv.groupby('tid')['table'].nunique() == 1).all()
    assert set(pv['model']) == MODELS and MODELS <= set(list_profiles())   # paper rows belong to settings.ini profiles
    assert set(pv['task']) == set(TASKS)
    ours = {m for m in pv['method'] if m.startswith('ours:')}
    assert set(pv['method']) - ours <= BASELINES
    assert {m.split(':t=')[0] for m in ours} <= set(STRATEGIES)
    assert not pv.duplicated(KEY).any(), pv[pv.duplicated(KEY, keep=False)]

def test_ranges(pv):
    a, rates = pv[pv['metric'] == 'accuracy'], pv[pv['metric'] != 'accuracy']
    assert a['value'].between(0, 100).all() and rates['value'].between(0, 1).all()
    assert set(rates['metric']) == {'image_masking_rate', 'object_masking_rate', 'iou'}

def test_tables_complete(pv):
    t1 = acc(pv, 'masking_refilling', 'clip-vit-b32-imagenet')
    assert list(t1.index) == ['zero_shot', 'vanilla_ft', *STRATEGIES] and not t1.isna().any().any()
    b32, b16 = acc(pv, 'comparison', 'clip-vit-b32-imagenet'), acc(pv, 'comparison', 'clip-vit-b16-imagenet')
    assert list(b32.index) == ['zero_shot', 'vanilla_ft', 'wise_ft', 'uniform_soup', 'ours:object:multi', 'ours:object:single']
    assert list(b16.index) == ['zero_shot', 'vanilla_ft', 'lp_ft', 'wise_ft', 'ours:object:multi', 'ours:object:single']
    assert not b32.isna().any().any()
    assert b16.isna().sum().to_dict() == {t: int(t in ('objectnet', 'ood_avg')) for t in TASKS}   # printed '/' for LP-FT only
    t2 = pv[pv['tid'] == 'cam_validation']
    assert set(t2['method']) == {f'ours:object:single:t={t}' for t in THRESHOLDS} and set(t2['task']) == {ID}
    assert (t2.groupby('method').size() == 3).all()

def test_ood_average_is_the_mean_of_the_five(pv):
    checked = 0
    for (tid, model), _ in pv[pv['metric'] == 'accuracy'].groupby(['tid', 'model']):
        t = acc(pv, tid, model).dropna()
        dev = (t['ood_avg'] - t[OOD].mean(axis=1)).abs()
        assert (dev <= ROUNDING).all(), dev[dev > ROUNDING]
        checked += len(t)
    assert checked == 12 + 6 + 5

def test_tables_1_and_3_agree_on_shared_rows(pv):
    "Table 3's B/32 zero-shot, vanilla and 'Ours' rows are table 1's zero-shot, vanilla and object-mask rows."
    t1, t3 = acc(pv, 'masking_refilling', 'clip-vit-b32-imagenet'), acc(pv, 'comparison', 'clip-vit-b32-imagenet')
    shared = ['zero_shot', 'vanilla_ft', 'ours:object:single', 'ours:object:multi']
    pd.testing.assert_frame_equal(t1.loc[shared], t3.loc[shared])

def test_bold_cells_are_column_maxima(pv):
    for (tid, model, task), method in BOLD.items():
        col = acc(pv, tid, model)[task].dropna()
        assert col[method] == col.max(), (tid, model, task, method, col.idxmax())
    # and every column of the three accuracy tables has its bold cell listed
    assert {(tid, m) for tid, m, _ in BOLD} == {('masking_refilling', 'clip-vit-b32-imagenet'), ('comparison', 'clip-vit-b32-imagenet'),
                                                ('comparison', 'clip-vit-b16-imagenet')}
    assert len(BOLD) == 3 * len(TASKS)

def test_cam_validation_is_monotone(pv):
    "A lower threshold masks a superset of patches: both masking rates grow; IoU never exceeds the object masking rate."
    t2 = pv[pv['tid'] == 'cam_validation'].assign(t=lambda d: d['method'].str.split('t=').str[1].astype(float))
    wide = t2.pivot(index='t', columns='metric', values='value').loc[THRESHOLDS]
    assert (wide['image_masking_rate'].diff().dropna() > 0).all() and (wide['object_masking_rate'].diff().dropna() > 0).all()
    assert (wide['iou'] <= wide['object_masking_rate']).all()   # |M∩S|/|M∪S| ≤ |M∩S|/|S|
    assert (wide['object_masking_rate'] > wide['image_masking_rate']).all()   # the paper's reading: the masks fall on the object
