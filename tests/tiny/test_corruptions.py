"Common corruptions: every one changes the image, is seeded, keeps size/mode/schema; bad names and severities fail clearly."
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1')

import numpy as np
import pytest
from datasets import load_from_disk
from PIL import Image

from fusion_nb.core import HyperparameterError, UnknownNameError
from fusion_nb.tiny.corruptions import CORRUPTIONS, PARAMS, corrupt, corrupt_dataset
from fusion_nb.tiny.tasks import build_split, build_task

SEVEN = {'motion_blur', 'impulse_noise', 'gaussian_noise', 'pixelate', 'spatter', 'contrast', 'jpeg_compression'}
RANDOM = {'motion_blur', 'impulse_noise', 'gaussian_noise', 'spatter'}   # the others are deterministic functions of the image

@pytest.fixture(scope='module')
def images():
    return list(build_split('cifar10', 'test', 10, seed=0)['image'])

def arr(im): return np.asarray(im, np.float64)

def test_the_seven_of_paper_000():
    assert set(CORRUPTIONS) == SEVEN == set(PARAMS)

@pytest.mark.parametrize('name', sorted(SEVEN))
@pytest.mark.parametrize('severity', [1, 3, 5])
def test_changes_keeps_size_mode_and_is_seeded(images, name, severity):
    outs = [corrupt(im, name, severity, rng=i) for i, im in enumerate(images)]
    assert all(o.size == im.size and o.mode == im.mode for o, im in zip(outs, images))
    assert sum(not np.array_equal(arr(o), arr(im)) for o, im in zip(outs, images)) >= 9   # (a rare spatter may miss)
    again = [corrupt(im, name, severity, rng=i) for i, im in enumerate(images)]
    assert all(np.array_equal(arr(a), arr(b)) for a, b in zip(outs, again))
    if name in RANDOM:
        other = [corrupt(im, name, severity, rng=i + 100) for i, im in enumerate(images)]
        assert any(not np.array_equal(arr(a), arr(b)) for a, b in zip(outs, other))

@pytest.mark.parametrize('name', sorted(SEVEN))
def test_greyscale_and_large_images(name):
    big = Image.fromarray((np.random.default_rng(0).random((224, 200, 3)) * 255).astype(np.uint8))
    out = corrupt(big, name, 2, rng=0)
    assert out.size == (200, 224) and out.mode == 'RGB' and not np.array_equal(arr(out), arr(big))
    grey = big.convert('L').resize((32, 32))
    g = corrupt(grey, name, 5, rng=0)
    assert g.mode == 'L' and g.size == (32, 32)

def test_bad_names_and_severities(images):
    im = images[0]
    with pytest.raises(UnknownNameError, match="unknown corruption 'fog'"): corrupt(im, 'fog', 1)
    for bad in [0, 6, -1, 2.5, True, '3']:
        with pytest.raises(HyperparameterError, match='severity'): corrupt(im, 'contrast', bad)
    with pytest.raises(UnknownNameError): corrupt(im, 'contrast', 1, params='mnist')
    ds = build_split('gtsrb', 'test', 4)
    with pytest.raises(UnknownNameError): corrupt_dataset(ds, 'snow', 1)
    with pytest.raises(HyperparameterError): corrupt_dataset(ds, 'spatter', 9)

def test_formulas_against_naive_computations():
    grey = Image.new('RGB', (32, 32), (128, 128, 128))
    # Gaussian noise on mid-grey (no clipping): the residual's spread is c (CIFAR-10-C severity 5: 0.10)
    r = (arr(corrupt(grey, 'gaussian_noise', 5, rng=1)) - 128) / 255
    assert abs(r.std() - 0.10) < 0.01 and abs(r.mean()) < 0.01
    # impulse noise: a fraction c of the values (CIFAR-10-C severity 5: 0.07) become 0 or 255
    x = arr(corrupt(grey, 'impulse_noise', 5, rng=1)); changed = x != 128
    assert 0.05 < changed.mean() < 0.09 and set(np.unique(x[changed])) <= {0., 255.}
    # contrast by hand on a large image (ImageNet-C severity 1: factor 0.4)
    rng = np.random.default_rng(0); a = rng.integers(0, 256, (100, 100, 3)).astype(np.uint8)
    m = (a / 255.).mean((0, 1)); want = np.clip(np.round(((a / 255. - m) * 0.4 + m) * 255), 0, 255)
    assert np.array_equal(arr(corrupt(Image.fromarray(a), 'contrast', 1)), want)
    # pixelate at factor 0.5 (ImageNet-C severity 2, 100 px) keeps a checkerboard of 25-pixel blocks nearly intact
    board = np.kron(np.indices((4, 4)).sum(0) % 2, np.ones((25, 25)))[..., None].repeat(3, -1) * 255
    assert np.abs(arr(corrupt(Image.fromarray(board.astype(np.uint8)), 'pixelate', 2)) - board).mean() < 40
    # JPEG round trip at quality 40 (CIFAR-10-C severity 5) is what Pillow gives
    import io
    im = build_split('gtsrb', 'test', 1)[0]['image']; buf = io.BytesIO(); im.save(buf, 'JPEG', quality=40)
    assert np.array_equal(arr(corrupt(im, 'jpeg_compression', 5)), arr(Image.open(buf).convert('RGB')))

def test_stronger_severity_corrupts_more(images):
    for name in ['gaussian_noise', 'impulse_noise', 'contrast', 'pixelate', 'motion_blur', 'jpeg_compression']:
        dev = [np.mean([np.abs(arr(corrupt(im, name, s, rng=i)) - arr(im)).mean() for i, im in enumerate(images)]) for s in (1, 3, 5)]
        assert dev[0] < dev[1] < dev[2], (name, dev)

def test_corrupt_dataset_keeps_schema_labels_and_disk(tmp_path):
    dd = build_task('eurosat', 'micro', 0)
    dd.save_to_disk(str(tmp_path/'eurosat'))
    loaded = load_from_disk(str(tmp_path/'eurosat'))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob('*'))
    out = corrupt_dataset(loaded, 'spatter', 2, seed=0)
    assert list(out) == list(dd) and all(out[s].features == dd[s].features for s in dd)
    assert all(out[s]['label'] == dd[s]['label'] for s in dd)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob('*')) == before          # no cache files in the dataset folder
    a = [arr(im) for im in out['test']['image']]; b = [arr(im) for im in corrupt_dataset(loaded['test'], 'spatter', 2, seed=0)['image']]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))                                  # a split alone: the same images
    c = [arr(im) for im in corrupt_dataset(loaded['test'], 'spatter', 2, seed=1)['image']]
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))
    # image i is corrupted with its own generator: the same as `corrupt` with that generator
    first = corrupt(loaded['test'][3]['image'], 'spatter', 2, rng=np.random.default_rng([0, list(PARAMS).index('spatter'), 2, 3]))
    assert np.array_equal(arr(first), a[3])
