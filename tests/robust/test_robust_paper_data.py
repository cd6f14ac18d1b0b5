"""Paper-scale data of paper 002 (fusion_nb.robust.paper_data), on sets built here in the real layouts: the hub's CIFAR-10
columns, ImageNet validation images named ILSVRC2012_val_*, a small real.json, ImageNet-C's folder tree, the cue-conflict
folders. Labels and the maps to the models' classes are checked against naive loops over the files."""
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from fusion_nb.catalog import IMAGENET_WNIDS
from fusion_nb.core import FusionError
from fusion_nb.robust.paper_data import (CIFAR10_CLASSES, CUE_CONFLICT_TO_IMAGENET, IMAGENET_C_CORRUPTIONS, classification_set,
                                         shift_set, standin_set)

def png(path, value):
    path.parent.mkdir(parents=True, exist_ok=True); Image.fromarray(np.full((5, 7, 3), value % 256, np.uint8)).save(path, format='PNG')

def test_cifar10_hub_layout(tmp_path):
    "uoft-cs/cifar10's columns (img, label): every evaluated image is its row's, with its row's label; all 10 classes kept in order."
    n = 25
    ims = [Image.fromarray(np.full((32, 32, 3), 10 * i, np.uint8)) for i in range(n)]
    feats = datasets.Features({'img': datasets.Image(), 'label': datasets.ClassLabel(names=list(CIFAR10_CLASSES))})
    datasets.DatasetDict({'test': datasets.Dataset.from_dict({'img': ims, 'label': [(3 * i) % 10 for i in range(n)]}, features=feats)}).save_to_disk(str(tmp_path/'c'))
    s = classification_set(str(tmp_path/'c'), 'cifar10', n)
    assert s.x.dtype == torch.uint8 and s.x.shape == (n, 3, 32, 32)
    for i in range(n): assert int(s.x[i, 0, 5, 5]) == 10 * i and int(s.y[i]) == (3 * i) % 10   # naive: row i
    logits = torch.nn.functional.one_hot(s.y, 10).float()
    assert s.correct(logits).all() and not s.correct(logits.roll(1, 1)).any()

def test_predictions_do_not_depend_on_batch_mates(tmp_path):
    "A set's decision for an image is the same alone and among others (IN-A-style 200 classes)."
    root = tmp_path/'a'
    for k, w in enumerate(IMAGENET_WNIDS[::5][:200]): png(root/w/'x.png', k)
    ds = datasets.load_dataset('imagefolder', data_dir=str(root), split='train')
    datasets.DatasetDict({'test': ds}).save_to_disk(str(tmp_path/'ina'))
    s = shift_set('imagenet_a', {'imagenet_a': str(tmp_path/'ina')}, 50, 150)
    scores = torch.randn(len(s['test']), 1000)
    whole = s['test'].decide(scores)
    assert all(int(s['test'].decide(scores[i:i + 1])) == int(whole[i]) for i in range(len(whole)))
    # naive: the arg-max over the 200 covered classes, mapped to the folder's position among the set's classes
    covered = sorted(IMAGENET_WNIDS.index(w) for w in IMAGENET_WNIDS[::5][:200])
    names = ds.features['label'].names
    naive = [names.index(IMAGENET_WNIDS[covered[int(scores[i, covered].argmax())]]) for i in range(len(scores))]
    assert whole.tolist() == naive

def test_imagenet_c_tree_and_real_json(tmp_path):
    "IN-C's <corruption>/<severity>/<wnid>/ tree: labels from the wnid folders; ReaL: accepted labels = real.json's list of the file."
    root = tmp_path/'inc'
    for c in IMAGENET_C_CORRUPTIONS:
        for v in range(1, 6):
            for k in (0, 17, 998): png(root/c/str(v)/IMAGENET_WNIDS[k]/f'ILSVRC2012_val_{k + 1:08d}.JPEG', k)
    s = shift_set('imagenet_c', {'imagenet_c': str(root)}, 1, 1, c_images=1)
    for sp in ('adapt', 'test'):
        e = s[sp]; assert len(e) == 75
        for i in range(len(e)): assert int(e.x[i, 0, 0, 0]) == int(e.y[i]) % 256   # the image of its own wnid folder
        assert sorted(zip(e.meta.corruption, e.meta.severity)) == sorted((c, v) for c in IMAGENET_C_CORRUPTIONS for v in range(1, 6))
    # ReaL on a validation split whose rows keep their file names
    files = sorted(tmp_path.joinpath('val').joinpath(f'ILSVRC2012_val_{k:08d}.JPEG') for k in range(1, 9))
    for k, f in enumerate(files): png(f, 30 * k)
    feats = datasets.Features({'image': datasets.Image(), 'label': datasets.ClassLabel(names=[f'n{i}' for i in range(1000)])})
    datasets.DatasetDict({'validation': datasets.Dataset.from_dict({'image': [str(f) for f in files], 'label': list(range(8))}, features=feats)}).save_to_disk(str(tmp_path/'in'))
    real = [[0], [], [2, 5], [3], [4], [5], [], [7, 1]]
    (tmp_path/'real.json').write_text(json.dumps(real))
    s = shift_set('imagenet_real', {'imagenet': str(tmp_path/'in'), 'imagenet_real': str(tmp_path/'real.json')}, 2, 10)
    got = sorted((int(e.x[i, 0, 0, 0]) // 30, sorted(torch.nonzero(e.accepted[i]).squeeze(1).tolist())) for e in s.values() for i in range(len(e)))
    assert got == [(k, sorted(l)) for k, l in enumerate(real) if l]   # naive: file k's list; empty lists left out
    (tmp_path/'real.json').write_text(json.dumps([[0]]))
    with pytest.raises(FusionError, match='fewer than the validation images'): shift_set('imagenet_real', {'imagenet': str(tmp_path/'in'), 'imagenet_real': str(tmp_path/'real.json')}, 2, 10)

def test_cue_conflict_folders_map_to_16_categories(tmp_path):
    "The shape's folder is the label; a prediction is the category whose ImageNet classes hold the arg-max over the 16 categories' classes."
    cats = sorted(CUE_CONFLICT_TO_IMAGENET)
    for c in cats:
        for j, t in enumerate(('clock', 'bear')): png(tmp_path/'cue'/c/f'{c}{j}-{t}{j + 3}.png', cats.index(c))
    s = shift_set('conflict_stimuli', {'conflict_stimuli': str(tmp_path/'cue')}, 10, 100)
    e = s['test']; assert len(e) == 22 and len(e.groups) == 16
    for i in range(len(e)): assert int(e.x[i, 0, 0, 0]) == int(e.y[i])   # the folder's category
    assert set(e.meta.texture) <= {cats.index('clock'), cats.index('bear')}
    scores = torch.randn(len(e), 1000); scores[:, 0] = 100   # class 0 (tench) is in no category: ignored
    members = {IMAGENET_WNIDS.index(w): cats.index(c) for c, ws in CUE_CONFLICT_TO_IMAGENET.items() for w in ws}
    naive = [members[max(members, key=lambda k: float(scores[i, k]))] for i in range(len(e))]
    assert e.decide(scores).tolist() == naive

def test_standin_set_is_the_tiny_path():
    "The tiny profile's sets: one class per label, so a decision is the plain arg-max."
    x, y = torch.rand(6, 3, 32, 32), torch.tensor([0, 1, 2, 3, 4, 11])
    s = standin_set(x, y, torch.nn.functional.one_hot(y, 12).bool())
    scores = torch.randn(6, 12)
    assert s.decide(scores).tolist() == scores.argmax(1).tolist() and s.groups == [[i] for i in range(12)]

def test_imagenet_c_splits_draw_per_cell(tmp_path):
    "Issue 24.2: one shuffle reused for all 75 cells put the same c_images base images in every cell of a split."
    root = tmp_path/'inc'
    for c in IMAGENET_C_CORRUPTIONS:
        for v in range(1, 6):
            for k in range(12): png(root/c/str(v)/IMAGENET_WNIDS[k]/f'ILSVRC2012_val_{k + 1:08d}.JPEG', k)
    s = shift_set('imagenet_c', {'imagenet_c': str(root)}, 1, 1, c_images=2)
    base = {sp: {int(e.y[i]) for i in range(len(e))} for sp, e in s.items()}   # the label is the base image here (one per wnid)
    assert all(len(s[sp]) == 150 for sp in s)
    assert min(len(b) for b in base.values()) >= 5       # before: exactly 2 distinct images per split
    assert base['adapt'].isdisjoint(base['test'])         # a corrupted copy of an adapt image is never a test image

def test_imagenet_real_test_holds_no_imagenet_selection_image(tmp_path):
    "Issue 24.3: IN-REAL's test split held IMAGENET's adapt (selection) images; they now follow IMAGENET's split."
    n = 60
    files = [tmp_path/'val'/f'ILSVRC2012_val_{k:08d}.JPEG' for k in range(1, n + 1)]
    for k, f in enumerate(files): png(f, 4 * k)
    feats = datasets.Features({'image': datasets.Image(), 'label': datasets.ClassLabel(names=[f'n{i}' for i in range(1000)])})
    datasets.DatasetDict({'validation': datasets.Dataset.from_dict({'image': [str(f) for f in files], 'label': [k % 1000 for k in range(n)]},
                                                                  features=feats)}).save_to_disk(str(tmp_path/'in'))
    (tmp_path/'real.json').write_text(json.dumps([[] if k % 7 == 3 else [k] for k in range(n)]))
    src = {'imagenet': str(tmp_path/'in'), 'imagenet_real': str(tmp_path/'real.json')}
    im, re_ = shift_set('imagenet', src, 20, 100), shift_set('imagenet_real', src, 20, 100)
    ids = lambda e: {int(e.x[i, 0, 0, 0]) // 4 for i in range(len(e))}   # which file: its pixel value
    assert ids(re_['test']).isdisjoint(ids(im['adapt'])) and ids(re_['adapt']).isdisjoint(ids(im['test']))
    assert ids(re_['adapt']) | ids(re_['test']) == {k for k in range(n) if k % 7 != 3}   # every labelled image, once
