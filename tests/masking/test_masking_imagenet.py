"""Paper 003 at paper scale, offline: test sets saved in the layouts the paper profiles read, labelled the way the real
sets are (WordNet ids, ImageNet label indices, ObjectNet folders), evaluated by `evaluate_id_ood` against a naive loop."""
import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image as ImageFeature, Value
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
from conftest import PAPERMILL

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

def test_soup_of_two_saved_tiny_models(imagenet_clip, tmp_path):
    "soup_state_dicts reads CLIPVisionModel and CLIPModel directories; their uniform soup is the tensor-by-tensor mean."
    from transformers import CLIPVisionModel
    from fusion_nb.checkpoints import vision_state_dict
    from fusion_nb.masking.imagenet_data import soup_state_dicts
    from fusion_nb.methods.soups import uniform_soup
    clip, _, _ = imagenet_clip
    g = torch.Generator().manual_seed(0)
    dirs, sds = [], []
    for i in range(2):   # two "fine-tunes": the pre-trained encoder moved at random, saved as transformers saves a CLIPVisionModel
        enc = CLIPVisionModel(clip.config.vision_config)
        enc.load_state_dict(clip.vision_model.state_dict())
        with torch.no_grad():
            for p in enc.parameters(): p.add_(0.1 * torch.randn(p.shape, generator=g))
        enc.save_pretrained(tmp_path/f'ft{i}'); dirs.append(str(tmp_path/f'ft{i}'))
        sds.append({k: v.clone() for k, v in enc.state_dict().items()})
    clip.save_pretrained(tmp_path/'clip')   # a CLIPModel directory is an ingredient too (its vision tower)
    pre = vision_state_dict(str(tmp_path/'clip'))
    soup = uniform_soup(pre, soup_state_dicts(' '.join(dirs)), progress=False)
    for k, v in sds[0].items():
        if k.endswith('position_ids'): continue
        assert torch.allclose(soup[k], (v + sds[1][k]) / 2, atol=1e-6), k
    soup2 = uniform_soup(pre, soup_state_dicts([dirs[0], str(tmp_path/'clip')]), progress=False)
    k = 'encoder.layers.0.self_attn.q_proj.weight'
    assert torch.allclose(soup2[k], (sds[0][k] + clip.vision_model.state_dict()[k]) / 2, atol=1e-6)
    with pytest.raises(FusionError, match='listed twice'): soup_state_dicts([dirs[0], dirs[0]])

def _run_31_with_soup(tmp_path, sources):
    "Experiment 31 on micro with `soup_ingredients` = `sources` (two seeds); its output folder, checked for one soup, no soup fine-tunes."
    import subprocess, sys
    import pandas as pd
    from conftest import REPO
    out = tmp_path/'out'
    yaml = f"thresholds: [0.5]\nwise_alphas: [0.5]\nfinetune_seeds: [0, 1]\nsoup_ingredients: '{' '.join(sources)}'\ntable2_images: 8"
    r = subprocess.run([*PAPERMILL, str(REPO/'nbs'/'experiments'/'31_masked_images_comparison.ipynb'), str(tmp_path/'run.ipynb'),
                        '-k', 'python3', '-p', 'profile', 'micro', '-p', 'output_dir', str(out), '-y', yaml],
                       cwd=REPO/'nbs'/'experiments', capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    res, t3s = pd.read_csv(out/'results.csv'), pd.read_csv(out/'table3_std.csv', index_col=0)
    assert not pd.read_csv(out/'runs.csv').hparam.astype(str).str.startswith('lr×').any()   # no fine-tunes for the soup
    assert sorted(m for m in res.model.unique() if m.startswith('uniform_soup')) == ['uniform_soup/s0']   # evaluated once
    assert (t3s.loc['Uniform soup'] == 0).all()   # one soup whatever the seed
    return out

def _micro_id_ood_sets():
    "The micro profile, experiment 31's six test sets as it loads them, and the ID class names."
    from fusion_nb.masking.counterfactual_ft import evaluation_splits
    from fusion_nb.pools import Task
    from fusion_nb.reproduce.profiles import load_profile
    tasks = ['imagenet', 'imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a']
    P = load_profile('micro', tasks=tasks)
    splits = evaluation_splits(tasks, P.test_split, P.extra.get('test_splits'))
    sets = {t: Task(t, P.datasets[t], split=splits[t]).load(splits[t], max_samples=P.max_test_samples, seed=P.seed) for t in tasks}
    return P, tasks, sets, Task('imagenet', P.datasets['imagenet']).load('train').features['label'].names

def test_comparison_notebook_takes_the_soup_from_soup_ingredients(tmp_path):
    "Experiment 31 with `soup_ingredients` (two saved micro encoders): no soup fine-tunes, one soup for every seed, its mean as the ingredients' average scores."
    import pandas as pd
    from conftest import REPO
    from fusion_nb.catalog import templates_for
    from fusion_nb.checkpoints import load_vision_model
    from fusion_nb.masking.counterfactual_ft import evaluate_id_ood
    from fusion_nb.pools import ModelPool
    a, b = [str(REPO/'data'/'micro'/'models'/f'clip-vit-tiny_{t}') for t in ('eurosat', 'dtd')]
    out = _run_31_with_soup(tmp_path, [a, b])
    res, t3 = pd.read_csv(out/'results.csv'), pd.read_csv(out/'table3.csv', index_col=0)
    # independently: average the two encoders by hand and score that model on the same test sets
    P, tasks, sets, names = _micro_id_ood_sets()
    sa, sb = load_vision_model(a).state_dict(), load_vision_model(b).state_dict()
    models = ModelPool(P.pretrained, {}, 'cpu')
    avg = models.vision_model({k: (sa[k] + sb[k]) / 2 for k in sa})
    hand = evaluate_id_ood({'avg': avg}, models.clip, models.tokenizer, models.processor, sets, names, templates_for('imagenet'),
                           batch_size=P.batch_size, progress=False).set_index('task')['value'] * 100
    got = res[res.model == 'uniform_soup/s0'].set_index('task')['value']
    assert got[tasks].values == pytest.approx(hand[tasks].values, abs=1e-9)
    assert t3.loc['Uniform soup', 'IN'] == pytest.approx(hand['imagenet'], abs=1e-9)

@pytest.mark.parametrize('notebook', ['30_masked_images.ipynb', '31_masked_images_comparison.ipynb'])
def test_paper_profile_run_offline_names_every_missing_dataset(notebook, tmp_path):
    "Run by papermill offline with an empty cache, a paper-003 notebook stops before any work, naming the six sets, the gated one and the folder layouts."
    import os, subprocess, sys
    from conftest import REPO
    env = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_HOME': str(tmp_path/'hf')}
    r = subprocess.run([*PAPERMILL, str(REPO/'nbs'/'experiments'/notebook), str(tmp_path/'run.ipynb'), '-k', 'python3',
                        '-p', 'profile', 'clip-vit-b32-imagenet', '-p', 'output_dir', str(tmp_path/'out')],
                       cwd=REPO/'nbs'/'experiments', capture_output=True, text=True, env=env)
    assert r.returncode != 0
    err = r.stderr
    assert "paper 003's datasets are not all readable (the hub ids are unverified" in err
    assert "hub dataset 'ILSVRC/imagenet-1k' is not in the local cache" in err and 'It is gated' in err
    for t in ('imagenet_r', 'imagenet_sketch', 'imagenet_a'): assert f'set dataset.{t} = path' in err, t
    if not (REPO/'data'/'paper003').exists():
        assert 'imagenet_v2: no dataset folder at' in err and 'objectnet: no dataset folder at' in err and 'red border' in err
    assert not (tmp_path/'out').exists() or not any((tmp_path/'out').iterdir())   # nothing was computed

def test_with_hub_access_a_gated_set_without_accepted_terms_is_named(monkeypatch):
    "With the hub reachable, only the gated ImageNet-1k is asked about (huggingface_hub.auth_check); refused, the message says what to do."
    import huggingface_hub, requests
    from huggingface_hub.errors import GatedRepoError
    from fusion_nb.pools import check_sources
    from fusion_nb.reproduce.profiles import load_profile
    asked = []
    def refuse(repo_id, repo_type=None, **kw):
        asked.append((repo_id, repo_type))
        r = requests.Response(); r.status_code, r.url = 403, f'https://huggingface.co/api/datasets/{repo_id}'
        raise GatedRepoError('gated', response=r)
    monkeypatch.setattr(huggingface_hub, 'auth_check', refuse)
    p = load_profile('clip-vit-b32-imagenet')
    hub_tasks = [t for t in p.tasks if not p.datasets[t].startswith('/')]
    with pytest.raises(FusionError, match=r"imagenet: your token has no access to the gated 'ILSVRC/imagenet-1k'\. It is gated: accept its terms"):
        check_sources(p, hub_tasks, hub_reachable=True)
    assert asked == [('ILSVRC/imagenet-1k', 'dataset')]
    monkeypatch.setattr(huggingface_hub, 'auth_check', lambda repo_id, repo_type=None, **kw: None)
    check_sources(p, hub_tasks, hub_reachable=True)   # access granted, every set on the hub: nothing to say

def _published_imagenet_r(path, images, wnids):
    "axiong/imagenet-r as its card publishes it: parquet shards under test/, a card with `configs:`, columns image, wnid, class_name (strings)."
    feats = Features({'image': ImageFeature(), 'wnid': Value('string'), 'class_name': Value('string')})
    (path/'test').mkdir(parents=True)
    Dataset.from_dict({'image': images, 'wnid': wnids, 'class_name': [f'name of {w}' for w in wnids]},
                      features=feats).to_parquet(str(path/'test'/'test-00000-of-00001.parquet'))
    (path/'README.md').write_text('---\nlicense: mit\nconfigs:\n- config_name: test\n  data_files:\n  - split: test\n'
                                  '    path: test/test-*\n  default: true\n---\n# ImageNet-R\n')
    return str(path)

def test_imagenet_r_in_its_published_schema_is_matched_by_wordnet_id(imagenet_clip, tmp_path):
    "No `label` column: each image's WordNet id string is its class, matched to ImageNet's classes by id (before: 'lacks column(s) ['label']')."
    clip, tok, proc = imagenet_clip
    images = _images(30, seed=11)
    logits = _id_logits(clip, tok, proc, images)
    cands = [[IMAGENET_WNIDS.index(w)] for w in IMAGENET_R_WNIDS]
    labels = _labels(logits, cands, seed=12)
    wnids = [IMAGENET_R_WNIDS[y] for y in labels]
    ds = Task('imagenet_r', _published_imagenet_r(tmp_path/'imagenet-r', images, wnids), split='test').load()
    names = ds.features['label'].names
    assert [names[y] for y in ds['label']] == wnids   # every image keeps its own WordNet id
    rec = evaluate_id_ood({'zero_shot': clip.vision_model}, clip, tok, proc, {'imagenet_r': ds}, IMAGENET.class_names, TEMPLATES,
                          id_wnids=IMAGENET_WNIDS, batch_size=16, progress=False).set_index('task')['value']
    present = sorted(set(wnids))   # the set's classes: the WordNet ids it holds
    naive = [present[_naive_prediction(r, [[IMAGENET_WNIDS.index(w)] for w in present])] for r in logits]
    assert rec['imagenet_r'] == pytest.approx(np.mean([p == w for p, w in zip(naive, wnids)]), abs=1e-12)

def test_comparison_notebook_scores_official_soup_files_with_their_head(tmp_path):
    "Issue 24.7: `soup_ingredients` naming official model-soups `.pt` files give table 3's uniform soup as the paper's ‡ row: their average, its own head and bias."
    import pandas as pd
    from test_masking import random_openai_clip
    from fusion_nb.masking.counterfactual_ft import classifier_accuracy
    from fusion_nb.masking.openai_clip import official_soup_classifier
    from fusion_nb.pools import ModelPool
    files = []
    for i in range(2):   # two random checkpoints in the official layout, 32 px like the micro CLIP, a head over its 12 ImageNet stand-in classes
        sd, g, r, (w, p, grid, e) = random_openai_clip(w=64, p=8, grid=4)
        sd = {k: v + 0.1 * i * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in sd.items()}
        torch.save({**{'model.' + k: v for k, v in sd.items() if not k.startswith('transformer.')},
                    'classification_head.weight': r(12, e) * (i + 1), 'classification_head.bias': r(12)}, tmp_path/f'official_{i}.pt')
        files.append(str(tmp_path/f'official_{i}.pt'))
    out = _run_31_with_soup(tmp_path, files)
    res = pd.read_csv(out/'results.csv')
    # independently: the two files averaged by hand (every tensor, head and bias included) and scored on the same test sets
    raw = [{k.removeprefix('model.'): v for k, v in torch.load(f, weights_only=True).items()} for f in files]
    clf = official_soup_classifier({k: (raw[0][k] + raw[1][k]) / 2 for k in raw[0] if raw[0][k].is_floating_point()}, vision_heads=1)
    P, tasks, sets, names = _micro_id_ood_sets()
    hand = classifier_accuracy({'soup': clf}, sets, ModelPool(P.pretrained, {}, 'cpu').processor, names, progress=False).set_index('task')['value'] * 100
    got = res[res.model == 'uniform_soup/s0'].set_index('task')['value']
    assert got[tasks].values == pytest.approx(hand[tasks].values, abs=1e-9)
    assert 'official checkpoints' in (out/'table3.md').read_text()
