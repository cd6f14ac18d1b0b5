"The task catalog, task and model pools: loaders on saved directories and datasets, layouts, and bad input."
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict
from PIL import Image
from safetensors.torch import load_file
from transformers import CLIPModel, CLIPVisionModel

from fusion_nb.catalog import CATALOG, DEFAULT_TEMPLATES, class_names_for, task_text, templates_for
from fusion_nb.core import FusionError, UnknownNameError
from fusion_nb.pools import PRETRAINED, ModelPool, Task, TaskPool, load_split
from fusion_nb.reproduce.profiles import load_profile
from conftest import MICRO_SPLITS, MICRO_TASKS

EIGHT = ['sun397', 'stanford_cars', 'resisc45', 'eurosat', 'svhn', 'gtsrb', 'mnist', 'dtd']

# ---------------------------------------------------------------- catalog

def test_catalog_counts_of_paper_000_tasks():
    assert [len(class_names_for(t)) for t in EIGHT] == [397, 196, 45, 10, 10, 43, 10, 47]
    assert [len(templates_for(t)) for t in EIGHT] == [2, 8, 18, 3, 1, 3, 1, 8]
    assert [len(class_names_for(t)) for t in ['cifar10', 'cifar100', 'stl10']] == [10, 100, 10]

def test_catalog_entries_are_well_formed():
    for name, tt in CATALOG.items():
        assert len(set(tt.class_names)) == len(tt.class_names), name
        assert all(isinstance(c, str) and c.strip() == c and c for c in tt.class_names), name
        assert all(t.count('{}') == 1 for t in tt.templates), name
        assert isinstance(tt.class_names, tuple) and isinstance(tt.templates, tuple)   # constants
    assert task_text('gtsrb').prompts('stop')[0] == 'a zoomed in photo of a "stop" traffic sign.'
    assert class_names_for('cifar100')[26] == 'crab'

def test_catalog_defaults_and_unknown_tasks():
    assert templates_for('not_a_task') == list(DEFAULT_TEMPLATES) == ['a photo of a {}.']
    templates_for('eurosat').append('changed')                 # callers get copies
    assert len(templates_for('eurosat')) == 3
    with pytest.raises(UnknownNameError, match="task 'imagenet-x' is not in the catalog. Known: cifar10"):
        class_names_for('imagenet-x')

# ---------------------------------------------------------------- tasks

def test_task_loads_saved_dataset(micro_project):
    src = micro_project/'datasets'/'colors'
    t = Task('colors', src)
    ds = t.load()
    assert len(ds) == MICRO_SPLITS['test'] and t.class_names == MICRO_TASKS['colors']
    assert t.templates == ['a photo of a {}.']
    assert len(t.load('validation')) == MICRO_SPLITS['validation']
    assert isinstance(ds[0]['image'], Image.Image)

def test_task_subsets_are_seeded_subsets(micro_project):
    t = Task('colors', micro_project/'datasets'/'colors')
    full = [np.asarray(im).tobytes() for im in t.load()['image']]
    a, b = t.load(max_samples=5, seed=3), t.load(max_samples=5, seed=3)
    sub = [np.asarray(im).tobytes() for im in a['image']]
    assert len(a) == 5 and a['label'] == b['label']
    idx = [full.index(x) for x in sub]
    assert idx == sorted(idx) and len(set(idx)) == 5        # distinct examples, in the dataset's order
    assert len(t.load(max_samples=100)) == MICRO_SPLITS['test']
    with pytest.raises(FusionError, match="task 'colors': max_samples must be ≥ 0"): t.load(max_samples=-1)

def test_unknown_split_lists_available(micro_project):
    with pytest.raises(FusionError, match="dataset of task 'colors' has no split 'dev'; available splits: train, validation, test"):
        Task('colors', micro_project/'datasets'/'colors', split='dev').load()

def test_class_name_count_mismatch_is_named(micro_project):
    t = Task('eurosat', micro_project/'datasets'/'colors', class_names=class_names_for('eurosat'))
    with pytest.raises(FusionError, match="task 'eurosat': 10 class names were given but the dataset .* has 4 classes"):
        t.load()

def _save(path, columns, features=None, single=False):
    ds = Dataset.from_dict(columns, features=features)
    (ds if single else DatasetDict(test=ds)).save_to_disk(str(path))
    return path

@pytest.mark.parametrize('columns,features,message', [
    ({'picture': [1], 'label': [0]}, None,  # ('img' is CIFAR-10's published name for image: read as image)
     r"dataset of task 'bad' lacks column\(s\) \['image'\]"),
    ({'image': [Image.new('RGB', (4, 4))]}, None, r"lacks column\(s\) \['label'\]"),
    ({'image': [Image.new('RGB', (4, 4))], 'label': [0]},
     datasets.Features({'image': datasets.Image(), 'label': datasets.Value('int64')}), "column 'label' must be a ClassLabel"),
    ({'image': [[1.0, 2.0]], 'label': [0]},
     datasets.Features({'image': datasets.Sequence(datasets.Value('float32')), 'label': ClassLabel(names=['a'])}),
     "column 'image' must be a datasets.Image feature"),
])
def test_bad_schemas_name_task_and_problem(tmp_path, columns, features, message):
    with pytest.raises(FusionError, match=message):
        Task('bad', _save(tmp_path/'d', columns, features)).load()

def test_bad_sources(tmp_path):
    with pytest.raises(FusionError, match="dataset of task 'gone' not found at"):
        Task('gone', tmp_path/'nope').load()
    (tmp_path/'empty').mkdir()
    with pytest.raises(FusionError, match="dataset of task 'odd': .* is not a dataset saved with save_to_disk"):
        Task('odd', tmp_path/'empty').load()
    feats = datasets.Features({'image': datasets.Image(), 'label': ClassLabel(names=['a'])})
    _save(tmp_path/'single', {'image': [Image.new('RGB', (4, 4))], 'label': [0]}, feats, single=True)
    with pytest.raises(FusionError, match="task 'one' at .* is a single Dataset without splits"):
        Task('one', tmp_path/'single').load()

def test_hub_dataset_offline_names_task_and_advice():
    with pytest.raises(FusionError, match="dataset 'fusion-nb-tests/no-such-dataset:cfg' of task 'x' could not be loaded.*local copy"):
        load_split('fusion-nb-tests/no-such-dataset:cfg', 'test', 'x')

def test_bad_templates():
    with pytest.raises(FusionError, match="task 't': prompt templates must each hold one"):
        Task('t', './d', templates=['a {} and a {}'])

# ---------------------------------------------------------------- task pool

def _profile(micro_project, **kw):
    base = dict(name='p', tasks=list(MICRO_TASKS), test_split='test', class_names='dataset',
                datasets={t: str(micro_project/'datasets'/t) for t in MICRO_TASKS})
    return SimpleNamespace(**{**base, **kw})

def test_task_pool_from_profile(micro_project):
    tp = TaskPool.from_profile(load_profile('micro-test', settings=micro_project/'settings.ini'))
    assert tp.names == list(MICRO_TASKS) and len(tp) == 2 and 'shapes' in tp
    assert tp['shapes'].class_names == MICRO_TASKS['shapes'] and tp['shapes'].split == 'test'
    with pytest.raises(UnknownNameError, match="unknown task 'cars'. Tasks in this pool: shapes, colors"): tp['cars']
    assert TaskPool.from_profile(_profile(micro_project), ['colors']).names == ['colors']
    with pytest.raises(UnknownNameError, match="unknown task 'cars': profile 'p' has no dataset for it"):
        TaskPool.from_profile(_profile(micro_project), ['colors', 'cars'])

def test_task_pool_catalog_names(micro_project):
    p = _profile(micro_project, class_names='catalog', tasks=['eurosat'], datasets={'eurosat': str(micro_project/'datasets'/'colors')})
    t = TaskPool.from_profile(p)['eurosat']
    assert t.class_names == class_names_for('eurosat') and t.templates == templates_for('eurosat')
    with pytest.raises(FusionError, match='10 class names were given but the dataset'): t.load()
    with pytest.raises(UnknownNameError, match="task 'shapes' has no class names in fusion_nb.catalog .*class_names = dataset"):
        TaskPool.from_profile(_profile(micro_project, class_names='catalog'))
    with pytest.raises(FusionError, match="class_names must be 'catalog' or 'dataset', got 'labels'"):
        TaskPool.from_profile(_profile(micro_project, class_names='labels'))

# ---------------------------------------------------------------- model pool

@pytest.fixture(scope='module')
def pools(micro_project):
    s = micro_project/'settings.ini'
    return ModelPool.from_profile(load_profile('micro-test', settings=s)), ModelPool.from_profile(load_profile('micro-test-old-layout', settings=s))

def test_model_pool_loads_pretrained_and_preprocessing(pools, micro_project):
    mp, _ = pools
    assert isinstance(mp.clip, CLIPModel) and not mp.clip.training and mp.names == list(MICRO_TASKS)
    assert mp.tokenizer('a photo of a circle.')['input_ids'][0] == mp.tokenizer.bos_token_id
    px = mp.processor(images=[Image.new('RGB', (50, 40))], return_tensors='pt')['pixel_values']
    assert tuple(px.shape) == (1, 3, mp.config.image_size, mp.config.image_size)
    assert PRETRAINED in mp and 'shapes' in mp and 'cars' not in mp

def test_vision_state_is_canonical_and_lazy(pools, micro_project):
    mp, _ = pools
    ref = CLIPVisionModel(mp.config).state_dict().keys()
    for name in [PRETRAINED, *MICRO_TASKS]:
        sd = mp.vision_state(name)
        assert set(sd) == set(ref) and sd.name == name
    raw = load_file(micro_project/'models'/'clip'/'model.safetensors')
    assert torch.equal(mp.vision_state(PRETRAINED)['encoder.layers.1.self_attn.q_proj.weight'],
                       raw['vision_model.encoder.layers.1.self_attn.q_proj.weight'])
    expert = load_file(micro_project/'models'/'expert_shapes'/'model.safetensors')
    assert torch.equal(mp.vision_state('shapes')['post_layernorm.bias'], expert['post_layernorm.bias'])

def test_transformers4_layout_reads_the_same(pools):
    mp, old = pools
    for name in [PRETRAINED, *MICRO_TASKS]:
        a, b = mp.vision_state(name), old.vision_state(name)
        assert set(a) == set(b)
        assert all(torch.equal(a[k], b[k]) for k in a), name
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for name in [PRETRAINED, 'colors']:
            torch.testing.assert_close(mp.vision_model(name)(pixel_values=x).pooler_output, old.vision_model(name)(pixel_values=x).pooler_output)
        ids = mp.tokenizer(['a photo of a red.'], return_tensors='pt')
        torch.testing.assert_close(mp.clip.get_text_features(**ids).pooler_output, old.clip.get_text_features(**ids).pooler_output)
    sa, sb = mp.clip.state_dict(), old.clip.state_dict()
    assert set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)

def test_vision_model_from_state_dict_and_dtype(pools, micro_project):
    mp, _ = pools
    pre, ex = mp.vision_state(PRETRAINED), mp.vision_state('shapes')
    merged = {k: (pre[k] + ex[k]) / 2 for k in pre}
    m = mp.vision_model(merged)
    assert isinstance(m, CLIPVisionModel) and not m.training
    assert torch.equal(m.state_dict()['encoder.layers.0.mlp.fc2.weight'], merged['encoder.layers.0.mlp.fc2.weight'])
    half = ModelPool(mp.pretrained, mp.experts, device='cpu', dtype='bfloat16')
    assert half.vision_model('shapes').dtype == torch.bfloat16 and half.clip.dtype == torch.bfloat16
    with pytest.raises(FusionError, match='expects a pool name or a state dict, got int'): mp.vision_model(3)

def test_model_pool_bad_names(pools, micro_project):
    mp, _ = pools
    with pytest.raises(UnknownNameError, match="unknown model 'cars'. Models in this pool: _pretrained_, shapes, colors"):
        mp.vision_state('cars')
    with pytest.raises(UnknownNameError, match="unknown model 'cars'"): mp.vision_model('cars')
    p = load_profile('micro-test', settings=micro_project/'settings.ini')
    with pytest.raises(UnknownNameError, match=r"profile 'micro-test' has no expert for task\(s\) \['cars'\]"):
        ModelPool.from_profile(p, ['shapes', 'cars'])
    assert ModelPool.from_profile(p, ['colors']).names == ['colors']
    with pytest.raises(FusionError, match="model directory .*nowhere.* does not exist"):
        ModelPool(str(micro_project/'nowhere'), {}).clip
