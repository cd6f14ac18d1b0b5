"""fusion_nb.robust.shifts: Table 1's shift stand-ins mean what their names say."""
import numpy as np
import pytest
import torch

from fusion_nb.core import FusionError, UnknownNameError
from fusion_nb.robust.shifts import CORRUPTIONS, SHIFTS, accuracy_of, build_shifts, conflict_scene, real_scene, shift_split, shift_tensors
from fusion_nb.tiny.tasks import IMAGENET_CLASSES, background_cue_accuracy, build_split, border_features

def test_columns_in_table_order():
    assert list(SHIFTS.values()) == ['IMAGENET', 'IN-REAL', 'IN-V2', 'IN-A', 'IN-R', 'IN-Sketch', 'Conflict Stimuli', 'IN-C']

def test_real_relabels_the_imagenet_test_images():
    real, plain = shift_split('imagenet_real', 'adapt', 60, 1), shift_split('imagenet', 'adapt', 60, 1)
    assert real['label'] == plain['label']
    two = [i for i, l in enumerate(real['labels']) if len(l) == 2]
    assert 15 <= len(two) <= 45 and all(real['label'][i] in real['labels'][i] for i in range(60))
    for i in range(60):   # one label: the very same image; two labels: the image changed (a second object was pasted)
        same = np.array_equal(np.asarray(real['image'][i]), np.asarray(plain['image'][i]))
        assert same == (i not in two), i

def test_conflict_stimuli_put_the_cue_on_the_texture_class():
    "A classifier of the image border (the stand-in's background cue) names the texture class of a conflict stimulus, not its shape."
    fit = build_split('imagenet', 'train', 240)
    cs = shift_split('conflict_stimuli', 'adapt', 120, 1)
    from datasets import Dataset
    as_texture = cs.remove_columns('label').add_column('label', cs['texture'])
    assert background_cue_accuracy(fit, as_texture) > 0.6
    assert background_cue_accuracy(fit, cs) < 0.2
    assert all(t != s for t, s in zip(cs['texture'], cs['label']))

def test_imagenet_c_every_corruption_and_severity_once_per_image_slot():
    c = shift_split('imagenet_c', 'test', 10, 35, c_images=2)
    pairs = list(zip(c['corruption'], c['severity']))
    assert len(c) == 70 and {p: pairs.count(p) for p in set(pairs)} == {(k, s): 2 for k in CORRUPTIONS for s in range(1, 6)}

def test_adapt_and_test_are_disjoint():
    a, t = shift_split('imagenet_v2', 'adapt', 20, 20), shift_split('imagenet_v2', 'test', 20, 20)
    fa = {np.asarray(im).tobytes() for im in a['image']}
    assert not fa & {np.asarray(im).tobytes() for im in t['image']}

def test_tensors_and_accuracy(tmp_path):
    f = build_shifts(tmp_path/'s', n_adapt=12, n_test=4, c_images=1, names=['imagenet_real'], progress=False)
    x, y, acc, meta = shift_tensors(f, 'imagenet_real')
    assert x.shape == (12, 3, 32, 32) and float(x.max()) <= 1 and acc.shape == (12, len(IMAGENET_CLASSES))
    assert acc[torch.arange(12), y].all() and (acc.sum(1) >= 1).all()
    second = torch.where(acc.sum(1) == 2)[0]
    if len(second):   # ReaL's rule: naming the other object is correct too
        i = int(second[0]); other = int([c for c in torch.where(acc[i])[0] if c != y[i]][0])
        assert bool(accuracy_of(torch.tensor([other]), acc[i:i + 1])[0])
    assert not bool(accuracy_of(torch.tensor([(int(y[0]) + 1) % 12]), acc[:1] & (torch.arange(12) == y[0]))[0])

def test_bad_input(tmp_path):
    with pytest.raises(UnknownNameError, match="unknown shift 'imagenet_o'"): shift_split('imagenet_o')
    with pytest.raises(FusionError, match='is not built'): shift_tensors(tmp_path, 'imagenet')
    with pytest.raises(Exception, match='n_adapt=0'): shift_split('imagenet', 'adapt', n_adapt=0)
