"The tiny benchmark's rendered tasks: determinism, schema, sizes, the ImageNet stand-in's spurious cue, the pretraining corpus."
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1')
import hashlib

import numpy as np
import pytest
from datasets import ClassLabel, DatasetDict, Image as ImageFeature, load_from_disk

from fusion_nb.core import UnknownNameError
from fusion_nb.tiny.tasks import (EIGHT_TASKS, IMAGENET_CLASSES, IMAGENET_TASKS, IMAGENET_VARIANTS, NEULIG_TASKS, PRETRAINING_TASKS,
                                  SCALES, TASKS, build_datasets, build_split, build_task, object_masks, pretraining_corpus, vocabulary)

PAPER_TASKS = ['sun397', 'stanford_cars', 'resisc45', 'eurosat', 'svhn', 'gtsrb', 'mnist', 'dtd',   # paper 000
               'cifar10', 'cifar100', 'stl10',                                                          # paper 001
               'imagenet', 'imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a']   # paper 003

def digest(dd) -> str:
    "Hash of every split's pixels, image sizes/modes and labels."
    h = hashlib.sha256()
    for split in sorted(dd):
        for ex in dd[split]:
            im = ex['image']; h.update(f'{split}{im.size}{im.mode}{ex["label"]}'.encode()); h.update(np.asarray(im).tobytes())
    return h.hexdigest()

@pytest.fixture(scope='module')
def micro():
    return {t: build_task(t, 'micro', seed=0) for t in TASKS}

def test_every_task_of_the_papers_is_there():
    assert set(TASKS) == set(PAPER_TASKS) and list(TASKS)[:8] == EIGHT_TASKS
    assert set(NEULIG_TASKS) == {'gtsrb', 'cifar100', 'resisc45', 'cifar10', 'mnist', 'stl10', 'svhn'}
    assert IMAGENET_TASKS == ['imagenet', *IMAGENET_VARIANTS] and len(IMAGENET_VARIANTS) == 5

def test_schema_splits_and_sizes(micro):
    for t, dd in micro.items():
        assert isinstance(dd, DatasetDict)
        want = ['test'] if t in IMAGENET_VARIANTS else ['train', 'validation', 'test']
        assert list(dd) == want, t
        for split, ds in dd.items():
            assert list(ds.features) == ['image', 'label']
            assert isinstance(ds.features['image'], ImageFeature) and isinstance(ds.features['label'], ClassLabel)
            assert ds.features['label'].names == list(TASKS[t].classnames)
            assert len(ds) == SCALES['micro'][split]
            im = ds[0]['image']
            assert im.size == (32, 32) and im.mode == 'RGB'
            k = len(TASKS[t].classnames)
            assert ds['label'] == [i % k for i in range(len(ds))]        # balanced, every class present at micro scale

def test_class_names_readable_distinct_and_label_spaces_differ():
    for t, spec in TASKS.items():
        assert 8 <= len(spec.classnames) <= 20, t
        assert len(set(spec.classnames)) == len(spec.classnames)
        assert all(c and c == c.strip() and c.lower() == c for c in spec.classnames)
    # the label spaces the papers treat as different tasks are different (SVHN/MNIST share digits, STL-10 shares CIFAR-10)
    spaces = {t: frozenset(s.classnames) for t, s in TASKS.items()}
    assert spaces['stl10'] == spaces['cifar10'] and spaces['svhn'] == spaces['mnist']
    assert not spaces['cifar10'] & spaces['cifar100'] and not spaces['imagenet'] & (spaces['cifar10'] | spaces['cifar100'])
    assert len({spaces[t] for t in ['sun397', 'stanford_cars', 'resisc45', 'eurosat', 'svhn', 'gtsrb', 'dtd', 'cifar10', 'cifar100', 'imagenet']}) == 10

def test_same_seed_same_bytes_other_seed_other_images(micro):
    for t in TASKS:
        again = build_task(t, 'micro', seed=0)
        assert digest(again) == digest(micro[t]), t
        assert digest(build_task(t, 'micro', seed=1)) != digest(micro[t]), t

def test_a_split_does_not_depend_on_what_else_is_built():
    first = build_split('cifar100', 'validation', 6, seed=3)
    for t in ['imagenet', 'stl10']: build_task(t, 'micro', seed=3)
    assert digest({'v': first}) == digest({'v': build_split('cifar100', 'validation', 6, seed=3)})
    # and a shorter split is a prefix of a longer one
    assert digest({'v': build_split('cifar100', 'validation', 4, seed=3)}) == digest({'v': first.select(range(4))})

def test_splits_and_tasks_differ(micro):
    px = lambda ds: {np.asarray(im).tobytes() for im in ds['image']}
    for t in ['cifar10', 'imagenet', 'gtsrb']:
        assert not px(micro[t]['train']) & px(micro[t]['test'])
    assert not px(micro['cifar10']['test']) & px(micro['stl10']['test'])
    assert not px(micro['imagenet']['test']) & px(micro['imagenet_v2']['test'])

def test_bad_names():
    with pytest.raises(UnknownNameError, match="unknown tiny task 'imagenet_c'"): build_task('imagenet_c', 'micro')
    with pytest.raises(UnknownNameError, match="unknown scale 'huge'"): build_task('mnist', 'huge')
    with pytest.raises(UnknownNameError, match="no split 'train'"): build_split('imagenet_r', 'train', 3)
    with pytest.raises(UnknownNameError): object_masks('svhn')

def test_tiny_scale_sizes_are_within_the_budget_design():
    s = SCALES['tiny']
    assert 300 <= s['train'] <= 2000 and 300 <= s['test'] <= 600 and s['validation'] > 0
    assert all(SCALES['micro'][k] < 100 for k in SCALES['micro'])

def test_build_datasets_saves_loads_and_skips(tmp_path):
    tasks = ['mnist', 'imagenet_sketch']
    out = build_datasets(tmp_path, 'micro', seed=0, tasks=tasks, progress=False)
    assert set(out) == set(tasks)
    for t in tasks:
        assert digest(load_from_disk(str(out[t]))) == digest(build_task(t, 'micro', 0))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(tasks)       # nothing left behind by the atomic writes
    stamp = (out['mnist']/'dataset_dict.json').stat().st_mtime_ns
    build_datasets(tmp_path, 'micro', seed=0, tasks=tasks, progress=False)  # present: skipped
    assert (out['mnist']/'dataset_dict.json').stat().st_mtime_ns == stamp
    build_datasets(tmp_path, 'micro', seed=1, tasks=['mnist'], progress=False, force=True)
    assert digest(load_from_disk(str(out['mnist']))) == digest(build_task('mnist', 'micro', 1))

def _border(ds, w=3):
    a = np.stack([np.asarray(im, np.float64) for im in ds['image']])
    frame = np.ones((32, 32), bool); frame[w:-w, w:-w] = False
    return a[:, frame].mean(1)                                             # mean border colour, (n, 3)

def _nearest_centroid_accuracy(fit, evaluate):
    "Predict the label from the mean border colour alone, by the nearest class centroid (fitted on `fit`)."
    X, y = _border(fit), np.asarray(fit['label'])
    cents = np.stack([X[y == k].mean(0) for k in range(len(IMAGENET_CLASSES))])
    Z = _border(evaluate)
    pred = ((Z[:, None] - cents[None]) ** 2).sum(-1).argmin(1)
    return (pred == np.asarray(evaluate['label'])).mean()

def test_imagenet_background_is_a_cue_in_distribution_and_broken_by_the_variants():
    fit = build_split('imagenet', 'train', 360, seed=0)
    acc = {t: _nearest_centroid_accuracy(fit, build_split(t, 'test', 240, seed=0)) for t in IMAGENET_TASKS}
    chance = 1 / len(IMAGENET_CLASSES)
    assert acc['imagenet'] > 5 * chance                                    # the background alone names the class
    assert acc['imagenet_v2'] < acc['imagenet']                            # a weaker cue in the new collection
    for v in ['imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a']:
        assert acc[v] < 2.5 * chance, (v, acc[v])                          # the cue is gone
    assert acc['imagenet_a'] < chance                                      # hard examples: a misleading background

def test_object_masks_line_up_with_the_images():
    dd, masks = build_task('imagenet', 'micro', 0), object_masks('imagenet', 'test', 'micro', 0)
    assert masks.shape == (SCALES['micro']['test'], 32, 32) and masks.dtype == bool
    xs = [np.asarray(im, np.float64) for im in dd['test']['image']]
    assert all(0 < m.sum() < 32 * 32 / 2 for m in masks)
    def contrast(x, m):  # how much more the masked pixels differ from the typical background than the rest do
        bg = np.median(x[~m], 0)
        return np.abs(x[m] - bg).mean() - np.abs(x[~m] - bg).mean()
    aligned = [contrast(x, m) for x, m in zip(xs, masks)]
    shuffled = [contrast(x, m) for x, m in zip(xs, np.roll(masks, 1, axis=0))]   # each image with another image's mask
    assert np.mean(np.array(aligned) > 0) >= 0.8
    assert np.mean(aligned) > np.mean(shuffled) + 10

def test_pretraining_corpus_and_vocabulary():
    a, b = list(pretraining_corpus(60, seed=0)), list(pretraining_corpus(60, seed=0))
    assert [c for _, c in a] == [c for _, c in b]
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for (x, _), (y, _) in zip(a, b))
    assert [c for _, c in a] != [c for _, c in pretraining_corpus(60, seed=1)]
    assert all(im.size == (32, 32) and im.mode == 'RGB' for im, _ in a)
    voc = vocabulary()
    assert all(c in voc for _, c in a)
    words = set(' '.join(voc).replace('"', ' ').replace('.', ' ').replace('!', ' ').split())
    assert all(w in words for spec in TASKS.values() for c in spec.classnames for w in c.split())
    # captions name the classes of every label space, the ImageNet classes included
    captions = ' '.join(c for _, c in pretraining_corpus(600, seed=0))
    for t in PRETRAINING_TASKS:
        assert any(c in captions for c in TASKS[t].classnames if not c.isdigit()) or t in ('svhn', 'mnist'), t
    assert set(PRETRAINING_TASKS) == set(TASKS) - set(IMAGENET_VARIANTS)

def test_pretraining_images_are_not_the_task_images():
    "The corpus shows the classes through a shift: none of its images is an image of a task's dataset."
    seen = {np.asarray(im).tobytes() for t in ['cifar10', 'imagenet', 'gtsrb'] for im in build_split(t, 'train', 40)['image']}
    assert not seen & {np.asarray(im).tobytes() for im, _ in pretraining_corpus(200, seed=0)}
