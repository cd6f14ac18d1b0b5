"bench/masking_candidate.py: a candidate ImageNet stand-in's renderer, patched in-process only inside its block."
import numpy as np, pytest

from conftest import bench_module
from fusion_nb.tiny import tasks as T

def _draw(): return T.imagenet_scene(T._rng(0, 'imagenet', 'train', 3), 3, 'imagenet')

def test_smaller_objects_and_a_full_cue_inside_the_renderer_as_it_was_after():
    cand = bench_module('masking_candidate')
    cue_before = T.IMAGENET_CUE
    before_image, before_mask = _draw()
    with cand.object_scale(0.6, cue=1.0):
        _, small_mask = _draw()
        assert T.IMAGENET_CUE == 1.0
    after_image, after_mask = _draw()
    assert 0 < small_mask.sum() < 0.6 * before_mask.sum()   # the area scales as 0.6² = 0.36
    assert T.IMAGENET_CUE == cue_before
    assert np.array_equal(np.asarray(after_image), np.asarray(before_image)) and np.array_equal(after_mask, before_mask)

def test_out_of_range_candidates_are_refused_and_change_nothing():
    cand = bench_module('masking_candidate')
    draw, scene = T.draw_sprite, T._object_scene
    for kw, name in [(dict(f=5), 'object-scale'), (dict(f=1, jitter=40), 'object-jitter'), (dict(f=1, cue=1.5), 'cue')]:
        with pytest.raises(ValueError, match=name):
            with cand.object_scale(**kw): pass
    assert T.draw_sprite is draw and T._object_scene is scene
