"""A paper profile pointed at a local mirror in the hub's own layouts, run end to end through `fusion-nb reproduce`.

The mirror is what `hf download … --local-dir` leaves on a machine without the hub: the pretrained CLIP with only a
`pytorch_model.bin` and an old-style `preprocessor_config.json` (openai/clip-vit-base-patch32's), experts whose weights
carry `vision_model.*` keys (tanganke's), and every dataset as parquet shards under `data/` or `<config>/` with a card
whose `configs:` names them (tanganke/<task>, ufldl-stanford/svhn's `cropped_digits`, ylecun/mnist). The models are
the real architecture (CLIPModel / CLIPVisionModel) in a small configuration with random weights; each task has a handful
of images in its published schema and the catalog's number of classes. The profile is a copy of clip-vit-b32 under
another name (`paper_model = clip-vit-b32`), so the comparison with paper 000 must still be written.
"""
import json, os, subprocess, sys, time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import datasets
from datasets import ClassLabel, Dataset, Features, Image as ImageFeature
from PIL import Image

from conftest import REPO, save_transformers4_layout
from fusion_nb.catalog import CATALOG
from fusion_nb.tiny.clip_factory import CLIP_MEAN, CLIP_STD

TASKS = ['sun397', 'stanford_cars', 'resisc45', 'eurosat', 'svhn', 'gtsrb', 'mnist', 'dtd']
BUDGET = dict(fisher_examples=4, regmean_examples=4, data_batch_size=4, tta_batch_size=4, adamerging_steps=2, adamerging_lr='1e-2',
              concrete_ta_steps=2, concrete_lw_steps=2, concrete_lr='1e-2', wemoe_steps=2, wemoe_lr='1e-3',
              wudi_steps=2)

def _parquet_layout(folder, splits, features, config=None, other_configs=()):
    "A dataset as the hub keeps it: <config or data>/<split>-00000-of-00001.parquet and a card whose `configs:` name them."
    sub = config or 'data'
    (folder/sub).mkdir(parents=True, exist_ok=True)
    card = ['---', 'configs:']
    for cfg in [config or 'default', *other_configs]:
        card += [f'- config_name: {cfg}', '  data_files:']
        for split in splits: card += [f'  - split: {split}', f'    path: {cfg if config else "data"}/{split}-*']
    for split, rows in splits.items():
        Dataset.from_dict(rows, features=features).to_parquet(str(folder/sub/f'{split}-00000-of-00001.parquet'))
    (folder/'README.md').write_text('\n'.join(card + ['---', '']))

def _images(n, seed, mode):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).convert(mode) for _ in range(n)]

def _old_style_pretrained(src, out):
    "openai/clip-vit-base-patch32's files: pytorch_model.bin only, and the CLIPFeatureExtractor preprocessor_config.json."
    from safetensors.torch import load_file
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in ('model.safetensors', 'preprocessor_config.json'): (out/f.name).write_bytes(f.read_bytes())
    torch.save(load_file(src/'model.safetensors'), out/'pytorch_model.bin')
    side = json.loads((src/'config.json').read_text())['vision_config']['image_size']
    (out/'preprocessor_config.json').write_text(json.dumps({'crop_size': side, 'do_center_crop': True, 'do_normalize': True,
        'do_resize': True, 'feature_extractor_type': 'CLIPFeatureExtractor', 'image_mean': list(CLIP_MEAN), 'image_std': list(CLIP_STD),
        'resample': 3, 'size': side}))

@pytest.fixture(scope='module')
def mirror(tmp_path_factory):
    "A project root whose settings.ini has `b32-mirror`: clip-vit-b32's keys, pointed at a mirror in the hub's layouts."
    from fusion_nb.tiny.clip_factory import make_clip_dir, make_expert_dirs
    root = tmp_path_factory.mktemp('hub_mirror'); m = root/'mirror'
    words = [t.format(c) for task in TASKS for c in CATALOG[task].class_names for t in CATALOG[task].templates]
    scratch = make_clip_dir(root/'scratch'/'clip', words, seed=0)
    _old_style_pretrained(scratch, m/'openai'/'clip-vit-base-patch32')
    experts = make_expert_dirs(scratch, str(root/'scratch'/'expert_{task}'), TASKS, noise=0.05)
    for t, d in experts.items():
        save_transformers4_layout(d, m/'tanganke'/f"clip-vit-base-patch32_{t.replace('stanford_cars', 'stanford-cars')}", prefix_vision=True)
    for i, t in enumerate(TASKS):
        names, mode = CATALOG[t].class_names, 'L' if t == 'mnist' else 'RGB'
        feats = Features({'image': ImageFeature(), 'label': ClassLabel(names=list(names))})
        rows = lambda n, s: {'image': _images(n, 10 * i + s, mode), 'label': [(7 * k + i) % len(names) for k in range(n)]}
        splits = {'train': rows(6, 0), 'test': rows(5, 1)}
        if t == 'svhn': _parquet_layout(m/'datasets'/'ufldl-stanford'/'svhn', splits, feats, config='cropped_digits', other_configs=['full_numbers'])
        elif t == 'mnist': _parquet_layout(m/'datasets'/'ylecun'/'mnist', splits, feats, config='mnist')
        else: _parquet_layout(m/'datasets'/'tanganke'/t, splits, feats)
    (root/'nbs').mkdir(); (root/'nbs'/'experiments').symlink_to(REPO/'nbs'/'experiments')
    (root/'data').mkdir(); (root/'data'/'paper_values').symlink_to(REPO/'data'/'paper_values')
    (root/'settings.ini').write_text("[DEFAULT]\ntasks = " + ' '.join(TASKS) + "\nclass_names = catalog\n\n[b32-mirror]\n"
        "description = clip-vit-b32 pointed at a local mirror in the hub's layouts\npaper_model = clip-vit-b32\n"
        "device = cpu\nbatch_size = 16\nexperiments = 00 04\n"
        "pretrained = ./mirror/openai/clip-vit-base-patch32\nexpert_template = ./mirror/tanganke/clip-vit-base-patch32_{task}\n"
        "expert.stanford_cars = ./mirror/tanganke/clip-vit-base-patch32_stanford-cars\n"
        "dataset_template = ./mirror/datasets/tanganke/{task}\ndataset.svhn = ./mirror/datasets/ufldl-stanford/svhn:cropped_digits\n"
        "dataset.mnist = ./mirror/datasets/ylecun/mnist\n" + ''.join(f'{k} = {v}\n' for k, v in BUDGET.items()))
    return root

def _reproduce(root, *args):
    env = {**os.environ, 'FUSION_NB_ROOT': str(root), 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'OMP_NUM_THREADS': '1'}
    return subprocess.run([sys.executable, '-c', 'import sys; from fusion_nb.reproduce.cli import main; raise SystemExit(main(sys.argv[1:]))',
                           'reproduce', '--no-progress', *args], env=env, capture_output=True, text=True, cwd=root)

def test_mirror_layouts_are_what_the_hub_ships(mirror):
    "The mirror really is in the hub's layouts (so that the run below proves they are read)."
    m = mirror/'mirror'
    assert sorted(f.name for f in (m/'openai'/'clip-vit-base-patch32').glob('*.bin')) == ['pytorch_model.bin']
    assert not any((m/'openai'/'clip-vit-base-patch32').glob('*.safetensors'))
    assert json.loads((m/'openai'/'clip-vit-base-patch32'/'preprocessor_config.json').read_text())['size'] == 32
    from safetensors import safe_open
    with safe_open(str(m/'tanganke'/'clip-vit-base-patch32_dtd'/'model.safetensors'), 'pt') as f:
        assert all(k.startswith('vision_model.') for k in f.keys())
    assert not any((m/'datasets').rglob('dataset_dict.json'))   # no save_to_disk folder anywhere
    assert (m/'datasets'/'ufldl-stanford'/'svhn'/'cropped_digits'/'test-00000-of-00001.parquet').exists()

@pytest.mark.slow   # a paper profile end to end on the mirror: make test-all
def test_paper_000_profile_on_the_mirror_end_to_end(mirror):
    "Experiments 00 and 04 of a renamed clip-vit-b32 on the mirror: they run, write every row of 04 and the comparison with paper 000."
    t0 = time.time()
    r = _reproduce(mirror, '--profile', 'b32-mirror')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = mirror/'outputs'/'b32-mirror'
    for exp in ('00_individual', '04_fusion_eight_tasks'):   # 01 reads the same models and sets as 04
        assert (out/exp/'table.csv').exists(), exp
        assert (out/exp/'table_vs_paper.csv').exists(), exp   # compared with clip-vit-b32's values although the profile has another name
    t04 = pd.read_csv(out/'04_fusion_eight_tasks'/'table.csv', index_col=0)
    pv = pd.read_csv(REPO/'data'/'paper_values'/'paper000.csv')
    paper_rows = pv[(pv['model'] == 'clip-vit-b32') & pv['table'].str.startswith('multi_task')]['method'].nunique()
    assert len(t04) == paper_rows and list(t04.columns) == [*TASKS, 'Avg.']   # every row of the paper's table
    assert t04.notna().all().all() and ((t04 >= 0) & (t04 <= 100)).all().all()
    print(f'paper 000 on the mirror: {time.time() - t0:.1f} s')

def test_only_checks_what_the_selected_experiment_reads(mirror):
    "Issue 54: on a mirror holding only what 00 reads, a profile that also runs 10 (paper 001's seven tasks) is refused as a"
    "whole, naming what 10 lacks, while `--only 00` passes the pre-check (the runner's and its kernel's) and runs."
    ini = mirror/'settings.ini'
    section = ini.read_text().split('[b32-mirror]\n')[1]
    if '[b32-mirror-10]' not in ini.read_text():
        ini.write_text(ini.read_text() + '\n[b32-mirror-10]\n' + section.replace('experiments = 00 04', 'experiments = 00 10'))
    r = _reproduce(mirror, '--profile', 'b32-mirror-10')
    assert r.returncode == 2 and 'running' not in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    missing = [f"{kind}.{t} = {mirror/'mirror'/'tanganke'/('clip-vit-base-patch32_' + t) if kind == 'expert' else mirror/'mirror'/'datasets'/'tanganke'/t}: no such folder"
               for kind in ('expert', 'dataset') for t in ('cifar10', 'cifar100', 'stl10')]   # experiment 10's tasks the mirror lacks
    assert all(m in r.stderr for m in missing), r.stderr[-3000:]
    assert 'of the sources its experiments read are missing' in r.stderr
    t0 = time.time()
    r = _reproduce(mirror, '--profile', 'b32-mirror-10', '--only', '00')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (mirror/'outputs'/'b32-mirror-10'/'00_individual'/'table.csv').exists()
    assert not (mirror/'outputs'/'b32-mirror-10'/'10_neulig').exists()
    print(f'--only 00 on the mirror: {time.time() - t0:.1f} s')

# --- paper 003: ImageNet and its shifts as the hub and their distributors publish them ---

SHIFT_BUDGET = dict(finetune_batch_size=4, finetune_epochs=1, finetune_lr='1e-3', finetune_warmup_steps=1, finetune_val_size=4,
                    finetune_seeds=0, maskings='random', refills='none', rates='0.5', thresholds='0.5', why_images=4)

@pytest.fixture(scope='module')
def imagenet_mirror(tmp_path_factory):
    "`b32-imagenet-mirror`: clip-vit-b32-imagenet's keys on ImageNet-1k (hub layout, its own class names), ImageNet-R and -A as "
    "axiong publishes them (WordNet-id strings), Sketch's parquet shards, and the two folders a user saves (V2, ObjectNet)."
    from datasets import DatasetDict
    from fusion_nb.catalog import IMAGENET, IMAGENET_A_WNIDS, IMAGENET_R_WNIDS, OBJECTNET_TO_IMAGENET
    from fusion_nb.tiny.clip_factory import make_clip_dir
    root = tmp_path_factory.mktemp('imagenet_mirror'); m = root/'mirror'
    words = list(IMAGENET.class_names) + [t.replace('{}', '').strip() for t in IMAGENET.templates]
    _old_style_pretrained(make_clip_dir(root/'scratch'/'clip', words, seed=0), m/'openai'/'clip-vit-base-patch32')
    hub_names = [f'{c}, as ImageNet-1k spells it {i}' for i, c in enumerate(IMAGENET.class_names)]
    cl = lambda names: Features({'image': ImageFeature(), 'label': ClassLabel(names=list(names))})
    rows = lambda n, k, s: {'image': _images(n, s, 'RGB'), 'label': [(37 * j + s) % k for j in range(n)]}
    _parquet_layout(m/'datasets'/'ILSVRC'/'imagenet-1k', {'train': rows(8, 1000, 1), 'validation': rows(4, 1000, 2)}, cl(hub_names))
    wn = Features({'image': ImageFeature(), 'wnid': datasets.Value('string'), 'class_name': datasets.Value('string')})
    for name, ids, s in (('imagenet-r', IMAGENET_R_WNIDS, 3), ('imagenet-a', IMAGENET_A_WNIDS, 4)):
        w = [ids[(11 * j + s) % len(ids)] for j in range(4)]
        _parquet_layout(m/'datasets'/'axiong'/name, {'test': {'image': _images(4, s, 'RGB'), 'wnid': w, 'class_name': w}}, wn, config='test')
    _parquet_layout(m/'datasets'/'songweig'/'imagenet_sketch', {'train': rows(4, 1000, 5)}, cl(hub_names))
    v2 = sorted(map(str, range(1000)))
    DatasetDict(test=Dataset.from_dict(rows(4, 1000, 6), features=cl(v2))).save_to_disk(str(root/'data'/'paper003'/'imagenet_v2'))
    DatasetDict(test=Dataset.from_dict(rows(4, 113, 7), features=cl(sorted(OBJECTNET_TO_IMAGENET)))).save_to_disk(str(root/'data'/'paper003'/'objectnet'))
    (root/'nbs').mkdir(); (root/'nbs'/'experiments').symlink_to(REPO/'nbs'/'experiments')
    (root/'data'/'paper_values').symlink_to(REPO/'data'/'paper_values')
    (root/'settings.ini').write_text("[b32-imagenet-mirror]\ndescription = clip-vit-b32-imagenet on a local mirror\n"
        "paper_model = clip-vit-b32-imagenet\ndevice = cpu\nbatch_size = 8\nclass_names = catalog\nexperiments = 30 31\n"
        "tasks = imagenet imagenet_v2 imagenet_r imagenet_sketch objectnet imagenet_a\ntest_split = test\n"
        "test_splits = imagenet:validation imagenet_sketch:train\npretrained = ./mirror/openai/clip-vit-base-patch32\n"
        "dataset.imagenet = ./mirror/datasets/ILSVRC/imagenet-1k\ndataset.imagenet_v2 = ./data/paper003/imagenet_v2\n"
        "dataset.imagenet_r = ./mirror/datasets/axiong/imagenet-r:test\ndataset.imagenet_sketch = ./mirror/datasets/songweig/imagenet_sketch\n"
        "dataset.objectnet = ./data/paper003/objectnet\ndataset.imagenet_a = ./mirror/datasets/axiong/imagenet-a:test\nsoup_ingredients =\n"
        + ''.join(f'{k} = {v}\n' for k, v in SHIFT_BUDGET.items()))
    return root

@pytest.mark.slow   # a paper profile end to end on the mirror: make test-all
def test_paper_003_profile_on_the_mirror(imagenet_mirror):
    "Experiment 30 of a renamed clip-vit-b32-imagenet on the mirror: every set read as published, scored, compared with paper 003."
    t0 = time.time()
    r = _reproduce(imagenet_mirror, '--profile', 'b32-imagenet-mirror', '--only', '30')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = imagenet_mirror/'outputs'/'b32-imagenet-mirror'/'30_masked_images'
    rec = pd.read_csv(out/'results.csv')
    assert set(rec['task']) == {'imagenet', 'imagenet_v2', 'imagenet_r', 'imagenet_sketch', 'objectnet', 'imagenet_a'}
    assert (out/'table1_vs_paper.csv').exists()
    print(f'paper 003 (experiment 30) on the mirror: {time.time() - t0:.1f} s')

def test_paper_003_sets_on_the_mirror_are_read_and_scored(imagenet_mirror):
    "prepare opens all six sets in their published layouts; experiment 30's reading path scores each over its classes, R and A by WordNet id."
    from fusion_nb.catalog import IMAGENET, IMAGENET_WNIDS
    from fusion_nb.masking.counterfactual_ft import evaluate_id_ood, evaluation_splits
    from fusion_nb.masking.imagenet_data import id_text
    from fusion_nb.pools import ModelPool, Task
    from fusion_nb.reproduce.profiles import load_profile, prepare
    P = prepare(load_profile('b32-imagenet-mirror', settings=imagenet_mirror/'settings.ini'), log=lambda s: None)
    splits = evaluation_splits(P.tasks, P.test_split, P.extra['test_splits'])
    sets = {t: Task(t, P.datasets[t], split=splits[t]).load() for t in P.tasks}
    assert [sets['imagenet_r'].features['label'].names[y] for y in sets['imagenet_r']['label']] == \
           pq_wnids(imagenet_mirror/'mirror'/'datasets'/'axiong'/'imagenet-r')   # each image keeps its WordNet id
    pool = ModelPool(P.pretrained, {}, 'cpu')
    ID = id_text(P, 'imagenet', sets['imagenet'].features['label'].names)
    assert ID.wnids == list(IMAGENET_WNIDS) and len(ID.templates) == len(IMAGENET.templates)
    rec = evaluate_id_ood({'zero_shot': pool.clip.vision_model}, pool.clip, pool.tokenizer, pool.processor, sets, ID.class_names,
                          ID.templates[:2], batch_size=8, device='cpu', progress=False, id_wnids=ID.wnids, id_aliases=ID.aliases)
    acc = rec.set_index('task')['value']
    assert set(acc.index) == set(P.tasks) and ((acc >= 0) & (acc <= 1)).all()

def pq_wnids(folder):
    "The `wnid` column of a parquet-layout set, read with pyarrow alone (an independent reader)."
    import pyarrow.parquet as pq
    return [w for f in sorted(Path(folder).rglob('*.parquet')) for w in pq.read_table(f, columns=['wnid'])['wnid'].to_pylist()]
