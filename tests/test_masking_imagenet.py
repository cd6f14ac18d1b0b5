"""Paper 003 at paper scale, offline: test sets saved in the layouts the paper profiles read, labelled the way the real
sets are (WordNet ids, ImageNet label indices, ObjectNet folders), evaluated by `evaluate_id_ood` against a naive loop."""
import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image as ImageFeature
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

from fusion_nb.catalog import IMAGENET, IMAGENET_A_WNIDS, IMAGENET_R_WNIDS, IMAGENET_WNIDS, OBJECTNET_TO_IMAGENET
from fusion_nb.core import FusionError
from fusion_nb.evaluation import zeroshot_head
from fusion_nb.masking.cam import ZeroShotLogits
from fusion_nb.masking.counterfactual_ft import evaluate_id_ood
from fusion_nb.pools import Task
from fusion_nb.tiny.clip_factory import make_clip_dir
from fusion_nb.tiny.finetune import pixel_values

TEMPLATES = ['a photo of a {}.']

@pytest.fixture(scope='module')
def imagenet_clip(tmp_path_factory):
    "A random tiny CLIP whose tokenizer knows ImageNet's 1000 CLIP class names."
    d = make_clip_dir(tmp_path_factory.mktemp('in_clip')/'clip', [t.format(c) for c in IMAGENET.class_names for t in TEMPLATES], seed=0)
    return CLIPModel.from_pretrained(d).eval(), AutoTokenizer.from_pretrained(d), AutoImageProcessor.from_pretrained(d)

def _images(n, seed):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]

def _id_logits(clip, tok, proc, images):
    "(n, 1000) logits of the zero-shot classifier over every ImageNet class: what a naive loop starts from."
    zs = ZeroShotLogits(clip.visual_projection, clip.logit_scale, zeroshot_head(clip, tok, IMAGENET.class_names, TEMPLATES))
    with torch.no_grad(): return zs(clip.vision_model(pixel_values=pixel_values(proc, images)).pooler_output)

def _naive_prediction(row, candidates):
    "The test class whose ID classes hold the largest logit: a loop over test classes and their ID classes."
    best, best_class = -float('inf'), None
    for j, ids in enumerate(candidates):
        for i in ids:
            if row[i] > best: best, best_class = float(row[i]), j
    return best_class

def _save(path, images, labels, names):
    "A DatasetDict with one `test` split, as `save_to_disk` writes it: the layout of the profile's local folders."
    feats = Features({'image': ImageFeature(), 'label': ClassLabel(names=list(names))})
    DatasetDict({'test': Dataset.from_dict({'image': images, 'label': labels}, features=feats)}).save_to_disk(str(path))
    return Task(path.name, str(path), split='test').load()

def _labels(logits, candidates, seed, right=0.7):
    "Labels that the restricted prediction gets right for about `right` of the images, the rest random."
    rng = np.random.default_rng(seed)
    return [(_naive_prediction(r, candidates) if rng.random() < right else int(rng.integers(len(candidates)))) for r in logits]

def test_shifted_sets_in_hub_layout_are_scored_over_their_class_subsets(imagenet_clip, tmp_path):
    "ImageNet-R (200 WordNet ids), ImageNet-V2 (folders '0'…'999' in ImageFolder's string order) and ObjectNet folders (several ImageNet classes each)."
    clip, tok, proc = imagenet_clip
    sets = {'imagenet_r': [[IMAGENET_WNIDS.index(w)] for w in IMAGENET_R_WNIDS],
            'imagenet_v2': [[int(s)] for s in sorted(map(str, range(1000)))],
            'objectnet': [[IMAGENET_WNIDS.index(w) for w in OBJECTNET_TO_IMAGENET[f]] for f in sorted(OBJECTNET_TO_IMAGENET)]}
    names = {'imagenet_r': IMAGENET_R_WNIDS, 'imagenet_v2': sorted(map(str, range(1000))), 'objectnet': sorted(OBJECTNET_TO_IMAGENET)}
    test_sets, expected = {}, {}
    for k, (task, candidates) in enumerate(sets.items()):
        images = _images(40, seed=k)
        logits = _id_logits(clip, tok, proc, images)
        labels = _labels(logits, candidates, seed=k)
        test_sets[task] = _save(tmp_path/task, images, labels, names[task])
        naive = [_naive_prediction(r, candidates) for r in logits]
        expected[task] = float(np.mean([p == y for p, y in zip(naive, labels)]))
        # the restriction matters: over all 1000 classes, many images' best class lies outside the subset
        covered = {i for ids in candidates for i in ids}
        if len(covered) < 1000: assert sum(int(r.argmax()) not in covered for r in logits) >= 5, task
    rec = evaluate_id_ood({'zero_shot': clip.vision_model}, clip, tok, proc, test_sets, IMAGENET.class_names, TEMPLATES,
                          id_wnids=IMAGENET_WNIDS, batch_size=16, progress=False)
    got = rec.set_index('task')['value']
    for task in sets:
        assert 0.5 < expected[task] < 1   # labels the restricted prediction mostly gets right: a wrong label mapping scores near 0
        assert got[task] == pytest.approx(expected[task], abs=1e-12), task

def test_imagenet_a_and_the_id_set_by_imagenet_1k_names(imagenet_clip, tmp_path):
    "ImageNet-A by WordNet id, and a hub-style ID set whose ClassLabel names are ImageNet-1k's own (aliases of the CLIP names)."
    clip, tok, proc = imagenet_clip
    hub_names = [f'{c}, synonym {i}' for i, c in enumerate(IMAGENET.class_names)]   # ImageNet-1k's names differ from CLIP's
    images = _images(30, seed=5)
    logits = _id_logits(clip, tok, proc, images)
    a_cands = [[IMAGENET_WNIDS.index(w)] for w in IMAGENET_A_WNIDS]
    a_labels, id_labels = _labels(logits, a_cands, seed=6), _labels(logits, [[i] for i in range(1000)], seed=7)
    test_sets = {'imagenet': _save(tmp_path/'imagenet', images, id_labels, hub_names),
                 'imagenet_a': _save(tmp_path/'imagenet_a', images, a_labels, IMAGENET_A_WNIDS)}
    rec = evaluate_id_ood({'zero_shot': clip.vision_model}, clip, tok, proc, test_sets, IMAGENET.class_names, TEMPLATES,
                          id_wnids=IMAGENET_WNIDS, id_aliases=[hub_names], batch_size=16, progress=False).set_index('task')['value']
    full = logits.argmax(-1).tolist()
    assert rec['imagenet'] == pytest.approx(np.mean([p == y for p, y in zip(full, id_labels)]), abs=1e-12)
    naive = [_naive_prediction(r, a_cands) for r in logits]
    assert rec['imagenet_a'] == pytest.approx(np.mean([p == y for p, y in zip(naive, a_labels)]), abs=1e-12)

def test_a_test_set_with_unknown_classes_is_named(imagenet_clip, tmp_path):
    clip, tok, proc = imagenet_clip
    ds = _save(tmp_path/'objectnet_all', _images(2, 0), [0, 1], ['alarm_clock', 'air_freshener'])   # ObjectNet has 313 classes: 200 are not ImageNet's
    with pytest.raises(FusionError, match=r"test set 'objectnet': test set classes not found among the 1000 ID classes: \['air_freshener'\]"):
        evaluate_id_ood({'zs': clip.vision_model}, clip, tok, proc, {'objectnet': ds}, IMAGENET.class_names, TEMPLATES,
                        id_wnids=IMAGENET_WNIDS, progress=False)
