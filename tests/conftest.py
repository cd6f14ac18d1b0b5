"""Shared fixtures: a micro project (CLIP dir, experts, datasets, settings.ini) built once per session.

The micro models are random-weight CLIPs made by `fusion_nb.clip_factory` and loaded through exactly the
loaders a hub id goes through; the datasets have the schema of `tanganke/<task>`.
"""
import os
from pathlib import Path

import numpy as np
import pytest
import datasets
from datasets import ClassLabel, Dataset, DatasetDict
from PIL import Image

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

REPO = Path(__file__).resolve().parents[1]
MICRO_TASKS = {'shapes': ['circle', 'square', 'cross'], 'colors': ['red', 'green', 'blue', 'yellow']}

def micro_dataset(path, classes, n_per_split=12, seed=0):
    "A DatasetDict (train/validation/test) of 32×32 images whose mean colour depends on the label."
    rng = np.random.default_rng(seed)
    feats = datasets.Features({'image': datasets.Image(), 'label': ClassLabel(names=list(classes))})
    splits = {}
    for s, split in enumerate(['train', 'validation', 'test']):
        labels = [i % len(classes) for i in range(n_per_split)]
        imgs = [Image.fromarray(np.clip(rng.normal(40 + 60 * y, 30, (32, 32, 3)), 0, 255).astype(np.uint8)) for y in labels]
        splits[split] = Dataset.from_dict({'image': imgs, 'label': labels}, features=feats)
    DatasetDict(splits).save_to_disk(str(path))
    return path

SETTINGS = """
[DEFAULT]
tasks = {tasks}
class_names = dataset
device = cpu
batch_size = 5
[micro-test]
description = micro project made by tests/conftest.py
pretrained = ./models/clip
expert_template = ./models/expert_{{task}}
dataset_template = ./datasets/{{task}}
[micro-test-old-layout]
description = the same models, experts saved in the transformers-4 layout
pretrained = ./models/clip
expert_template = ./models/old_expert_{{task}}
dataset_template = ./datasets/{{task}}
"""

@pytest.fixture(scope='session')
def micro_project(tmp_path_factory):
    "A scratch project root with settings.ini (profiles micro-test, micro-test-old-layout), models and datasets."
    import torch
    from safetensors.torch import save_file
    from fusion_nb.catalog import DEFAULT_TEMPLATES
    from fusion_nb.checkpoints import vision_state_dict
    from fusion_nb.clip_factory import make_clip_dir, make_expert_dirs
    root = tmp_path_factory.mktemp('micro_project')
    words = [t.format(c) for cs in MICRO_TASKS.values() for c in cs for t in DEFAULT_TEMPLATES]
    make_clip_dir(root/'models'/'clip', words, seed=0)
    experts = make_expert_dirs(root/'models'/'clip', str(root/'models'/'expert_{task}'), list(MICRO_TASKS), noise=0.05)
    for task, d in experts.items():   # the same weights in transformers 4's layout (prefixed keys, position_ids)
        old = root/'models'/f'old_expert_{task}'; old.mkdir()
        (old/'config.json').write_text((d/'config.json').read_text())
        sd = vision_state_dict(d)
        tensors = {'vision_model.' + k: sd[k].contiguous() for k in sd}
        tensors['vision_model.embeddings.position_ids'] = torch.arange(17)[None]
        save_file(tensors, old/'model.safetensors')
    for i, (task, classes) in enumerate(MICRO_TASKS.items()):
        micro_dataset(root/'datasets'/task, classes, seed=i)
    (root/'settings.ini').write_text(SETTINGS.format(tasks=' '.join(MICRO_TASKS)))
    (root/'nbs').mkdir()
    (root/'nbs'/'experiments').symlink_to(REPO/'nbs'/'experiments')
    return root
