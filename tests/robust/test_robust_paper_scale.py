"""Experiments 20 and 21 on the paper-scale code path (the `robust-soups` profile's), offline on CPU: a profile like it whose
test sets are small folders in the real layouts (the hub's CIFAR-10 columns, ImageNet validation files, real.json, V2's index
folders, A/R's 200 WordNet-id folders, the cue-conflict folders, ImageNet-C's tree) and whose models are random TorchScript
ConvNets. Checked against independent computations: plain APGD at the paper's radii, plain arg-max accuracies."""
import json, os, subprocess, sys
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from fusion_nb.catalog import IMAGENET_WNIDS
from fusion_nb.robust.attacks import apgd, budget
from fusion_nb.robust.models import convnet
from fusion_nb.robust.paper_data import CIFAR10_CLASSES, CUE_CONFLICT_TO_IMAGENET, IMAGENET_C_CORRUPTIONS, classification_set, shift_set
from fusion_nb.robust.zoo import zoo_specs
from conftest import PAPERMILL

REPO = Path(__file__).resolve().parents[2]
rng = np.random.default_rng(0)
def image(h=40, w=30): return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))

def save(path, split, names, labels, column='image', ims=None):
    feats = datasets.Features({column: datasets.Image(), 'label': datasets.ClassLabel(names=list(names))})
    ims = ims if ims is not None else [image() for _ in labels]
    datasets.DatasetDict({split: datasets.Dataset.from_dict({column: ims, 'label': list(labels)}, features=feats)}).save_to_disk(str(path))

@pytest.fixture(scope='module')
def root(tmp_path_factory):
    "A project root with a `paper-fake` profile: the robust-soups layout, small local sets and random TorchScript models."
    r = tmp_path_factory.mktemp('paper'); (r/'nbs').symlink_to(REPO/'nbs'); d = r/'data'
    save(d/'c10', 'test', CIFAR10_CLASSES, [i % 10 for i in range(12)], column='img', ims=[image(32, 32) for _ in range(12)])
    (d/'val').mkdir(parents=True)
    files = [d/'val'/f'ILSVRC2012_val_{k:08d}.JPEG' for k in range(1, 21)]
    for f in files: image().save(f, format='PNG')
    save(d/'in', 'validation', [f'class {i}' for i in range(1000)], [37 * k % 1000 for k in range(20)], ims=[str(f) for f in files])
    (d/'real.json').write_text(json.dumps([[37 * k % 1000, 5] if k % 3 else [] for k in range(20)]))
    save(d/'v2', 'test', sorted(map(str, range(1000))), [i * 71 % 1000 for i in range(14)])
    for t in ('a', 'r'): save(d/t, 'test', IMAGENET_WNIDS[::5][:200], [i * 13 % 200 for i in range(14)])
    save(d/'sketch', 'train', [f'class {i}' for i in range(1000)], [i * 3 for i in range(14)])
    for c in CUE_CONFLICT_TO_IMAGENET: image().save((d/'cue'/c).mkdir(parents=True) or d/'cue'/c/f'{c}1-cat2.png', format='PNG')
    for c in IMAGENET_C_CORRUPTIONS:
        for v in range(1, 6):
            for k in (1, 2): (d/'inc'/c/str(v)/IMAGENET_WNIDS[k]).mkdir(parents=True, exist_ok=True); image(224, 224).save(d/'inc'/c/str(v)/IMAGENET_WNIDS[k]/f'ILSVRC2012_val_{k:08d}.JPEG', format='PNG')
    ckpt = {}
    for ds, k in (('cifar10', 10), ('imagenet', 1000)):
        (r/'models'/ds).mkdir(parents=True)
        for i, s in enumerate(zoo_specs(ds, ('linf', 'l2', 'l1'))):
            torch.manual_seed(i); torch.jit.save(torch.jit.script(convnet(4, k).eval()), str(r/'models'/ds/f'{s.name}.pt'))
        ckpt[ds] = ' '.join(f'{s.name}=./models/{ds}/{s.name}.pt' for s in zoo_specs(ds, ('linf', 'l2', 'l1')))
    # Table 1's AdvProp row: another architecture (width 6), which experiment 20 must leave out of its soups
    torch.manual_seed(99); torch.jit.save(torch.jit.script(convnet(6, 1000).eval()), str(r/'models'/'imagenet'/'advprop.pt'))
    ckpt['imagenet'] += ' advprop=./models/imagenet/advprop.pt'
    (r/'settings.ini').write_text(f"""[paper-fake]
description = the robust-soups layout on small local sets
device = cpu
batch_size = 5
pretrained = ./models/cifar10/theta_linf.pt
experiments = 20 21
tasks = cifar10 imagenet imagenet_real imagenet_v2 imagenet_a imagenet_r imagenet_sketch conflict_stimuli imagenet_c
dataset.cifar10 = ./data/c10
dataset.imagenet = ./data/in
dataset.imagenet_real = ./data/real.json
dataset.imagenet_v2 = ./data/v2
dataset.imagenet_a = ./data/a
dataset.imagenet_r = ./data/r
dataset.imagenet_sketch = ./data/sketch
dataset.conflict_stimuli = ./data/cue
dataset.imagenet_c = ./data/inc
robust_bases = linf l2 l1
robust_eval_images = 6
robust_eval_steps = 2
robust_simplex_attack = eval
robust_checkpoints_cifar10 = {ckpt['cifar10']}
robust_checkpoints_imagenet = {ckpt['imagenet']}
shift_adapt_images = 6
shift_test_images = 6
shift_c_images = 1
held_out_images = 3
selection_sizes = 2
""")
    return r

def run(root, name, *params):
    out = root/'out'/name
    args = [*PAPERMILL, str(REPO/'nbs'/'experiments'/f'{name}.ipynb'), str(root/f'{name}.run.ipynb'), '-k', 'python3',
            '-p', 'profile', 'paper-fake', '-p', 'output_dir', str(out), *params]
    env = {**os.environ, 'FUSION_NB_ROOT': str(root), 'HF_HUB_OFFLINE': '1', 'PYTHONPATH': str(REPO)}
    r = subprocess.run(args, env=env, capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    return out

@pytest.mark.slow   # paper-scale shapes: make test-all
def test_fronts_at_paper_scale(root):
    "Fig. 5's w = 1 is θ∞ itself: its ℓ∞ robust accuracy on the ImageNet validation images at the paper's ε∞ = 4/255, by plain APGD."
    out = run(root, '20_robust_fronts')
    fig5 = pd.read_csv(out/'table_fig5.csv', index_col=0)
    for ds in ('cifar10', 'imagenet'):
        m = torch.jit.load(str(root/'models'/ds/'theta_linf.pt')).eval()
        s = classification_set(str(root/'data'/('c10' if ds == 'cifar10' else 'in')), ds, 6)
        x, y = s.x.float() / 255, s.y
        with torch.no_grad(): clean = m(x).argmax(1) == y
        ok = torch.zeros_like(clean)
        if clean.any(): ok[clean] = apgd(m, x[clean], y[clean], 'linf', budget(ds, 'linf')['eps'], steps=2, loss='dlr').robust
        assert fig5.loc[1.0, ds] == pytest.approx(100 * float(ok.float().mean()))
    for f in ['figure1', 'figure2', 'figure3', 'figure4', 'figure5', 'findings']: assert any(out.glob(f'{f}.*'))

@pytest.mark.slow   # paper-scale shapes: make test-all
def test_shifts_at_paper_scale(root):
    "Table 1's θ∞ and AdvProp rows: per shift, the plain accuracy of the model on the test split, predictions restricted to the shift's classes."
    out = run(root, '21_robust_shifts', '-p', 'radii', 'False', '-y', 'grid: [0, 1, 0.5]')   # 10 soups, not 480: the rows checked are single models
    t1 = pd.read_csv(out/'table1.csv', index_col=[0, 1, 2])
    for setup, file in (('Adversarial training (θ∞)', 'theta_linf.pt'), ('AdvProp', 'advprop.pt')):
        check_row(root, t1.xs(setup, level='setup').iloc[0], torch.jit.load(str(root/'models'/'imagenet'/file)).eval())
    assert (out/'table1.md').exists() and (out/'findings.md').exists()

def check_row(root, row, m):
    "Each of four shifts: `row`'s accuracy equals model `m`'s plain restricted arg-max accuracy on the test split."
    d = root/'data'
    src = {'imagenet': str(d/'in'), 'imagenet_real': str(d/'real.json'), 'imagenet_a': str(d/'a'), 'conflict_stimuli': str(d/'cue'), 'imagenet_v2': str(d/'v2')}
    cats = sorted(CUE_CONFLICT_TO_IMAGENET)
    for name, col in (('imagenet_a', 'IN-A'), ('conflict_stimuli', 'Conflict Stimuli'), ('imagenet_real', 'IN-REAL'), ('imagenet_v2', 'IN-V2')):
        e = shift_set(name, src, 6, 6)['test']
        with torch.no_grad(): logits = m(e.x.float() / 255)
        right = []
        for i in range(len(e)):   # naive: arg-max over the classes the shift covers, then its label
            covered = sorted(c for g in e.groups for c in g)
            best = covered[int(logits[i, covered].argmax())]
            right.append(bool(e.accepted[i, next(j for j, g in enumerate(e.groups) if best in g)]))
        assert row[col] == pytest.approx(100 * np.mean(right)), name
