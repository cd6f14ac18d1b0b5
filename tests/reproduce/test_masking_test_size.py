"bench/masking_test_size.py: experiment 30's pick per method and seed, its claims' names, and longer test splits that extend the built ones."
import numpy as np, pandas as pd

from conftest import bench_module
from fusion_nb.tiny.tasks import build_split

def test_the_pick_is_the_best_validation_run_of_each_method_and_seed_the_first_on_ties():
    b = bench_module('masking_test_size')
    runs = pd.DataFrame({'model': ['a/0.3/s0', 'a/0.4/s0', 'a/0.5/s0', 'a/0.3/s1', 'a/0.4/s1', 'v/s0'],
                         'method': ['a', 'a', 'a', 'a', 'a', 'v'], 'seed': [0, 0, 0, 1, 1, 0],
                         'val_accuracy': [0.5, 0.7, 0.7, 0.9, 0.2, 0.1]})
    assert sorted(b.picked(runs).model) == ['a/0.3/s1', 'a/0.4/s0', 'v/s0']

def test_claims_are_named_as_experiment_30_names_them():
    names = [c[0] for c in bench_module('masking_test_size').claims()]
    assert 'single-fill beats no-fill on OOD (random-mask)' in names and 'object-mask beats random-mask on OOD (no-fill)' in names
    assert len(names) == len(set(names)) == 9

def test_a_longer_test_split_begins_with_the_built_one():
    short, long = build_split('imagenet_a', 'test', 6), build_split('imagenet_a', 'test', 15)
    assert long['label'][:6] == short['label']
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(long['image'][:6], short['image']))
