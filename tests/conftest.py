"""Shared fixtures: a micro project (CLIP dir, experts, datasets, settings.ini) built once per session.

The micro models are random-weight CLIPs made by `fusion_nb.tiny.clip_factory` and loaded through exactly the
loaders a hub id goes through; the datasets have the schema of `tanganke/<task>` (`image`, `label` ClassLabel).
The same weights are also saved the way transformers 4 saved them, to check that both layouts load alike.
"""
import os, sys
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
os.environ.setdefault('FUSION_NB_TRACK', '0')   # the runs tests make are not tracked (tests/reproduce/test_tracking.py turns it on)

import numpy as np
import pytest
import datasets
from datasets import ClassLabel, Dataset, DatasetDict
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
# an experiment notebook run as its users run it, waiting for the kernel as `fusion-nb reproduce` does (papermill's own 60 s
# failed a run on 2 cores busy with the other test processes and a Ray cluster)
from fusion_nb.reproduce.runner import KERNEL_START_TIMEOUT
PAPERMILL = [sys.executable, '-m', 'papermill', '--start-timeout', str(KERNEL_START_TIMEOUT)]
# task → class names; 'shapes' has greyscale images (like MNIST), 'colors' RGB ones
MICRO_TASKS = {'shapes': ['circle', 'square', 'cross'], 'colors': ['red', 'green', 'blue', 'yellow']}
MICRO_MODES = {'shapes': 'L', 'colors': 'RGB'}
MICRO_SPLITS = {'train': 12, 'validation': 6, 'test': 12}
MICRO_TEMPLATES = ['a photo of a {}.', 'a drawing of a {}.']

def bench_module(name:str):
    "Import `bench/<name>.py` (scripts, not a package) as a module, with bench/ on the path for the scripts it imports beside it."
    import importlib.util, sys
    if str(REPO/'bench') not in sys.path: sys.path.insert(0, str(REPO/'bench'))
    spec = importlib.util.spec_from_file_location(name, REPO/'bench'/f'{name}.py')
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m

def micro_dataset(path, classes, mode='RGB', splits=MICRO_SPLITS, seed=0):
    "Save a DatasetDict of 32×32 images whose brightness depends on the label; return `path`."
    rng = np.random.default_rng(seed)
    feats = datasets.Features({'image': datasets.Image(), 'label': ClassLabel(names=list(classes))})
    dd = {}
    for split, n in splits.items():
        labels = [i % len(classes) for i in range(n)]
        imgs = [Image.fromarray(np.clip(rng.normal(40 + 60 * y, 30, (32, 32, 3)), 0, 255).astype(np.uint8)).convert(mode)
                for y in labels]
        dd[split] = Dataset.from_dict({'image': imgs, 'label': labels}, features=feats)
    DatasetDict(dd).save_to_disk(str(path))
    return path

def scratch_sources(root, tasks='ab', model='models/none', datasets='datasets'):
    """Create what a scratch profile names (pretrained `model`, experts `model_<task>`, datasets `datasets/<task>`), empty
    model folders and small datasets: `prepare` checks every source before anything runs, even for toy notebooks that read none."""
    root = Path(root)
    for d in [model, *[f'{model}_{t}' for t in tasks]]: (root/d).mkdir(parents=True, exist_ok=True)
    for t in tasks:
        if not (root/datasets/t).exists(): micro_dataset(root/datasets/t, ['x', 'y'], splits={'train': 2, 'test': 2})
    return root

def save_transformers4_layout(src_dir, out_dir, prefix_vision:bool):
    """Copy a model dir, rewriting its weights as transformers 4 saved them: vision keys under `vision_model.`
    (for a CLIPVisionModel, `prefix_vision`) and the integer `position_ids` buffers."""
    import json, shutil, torch
    from safetensors.torch import load_file, save_file
    out_dir = Path(out_dir); out_dir.mkdir(parents=True)
    for f in Path(src_dir).iterdir():
        if f.name != 'model.safetensors': shutil.copy(f, out_dir/f.name)
    sd = load_file(Path(src_dir)/'model.safetensors')
    cfg = json.loads((Path(src_dir)/'config.json').read_text())
    vcfg = cfg.get('vision_config', cfg)
    n_pos = (vcfg['image_size'] // vcfg['patch_size']) ** 2 + 1
    if prefix_vision: sd = {'vision_model.' + k: v for k, v in sd.items()}
    sd['vision_model.embeddings.position_ids'] = torch.arange(n_pos)[None]
    if 'text_config' in cfg:
        sd['text_model.embeddings.position_ids'] = torch.arange(cfg['text_config']['max_position_embeddings'])[None]
    save_file({k: v.contiguous() for k, v in sd.items()}, out_dir/'model.safetensors', metadata={'format': 'pt'})
    return out_dir

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
description = the same models saved in the transformers-4 layout
pretrained = ./models/old_clip
expert_template = ./models/old_expert_{{task}}
dataset_template = ./datasets/{{task}}
"""

@pytest.fixture(scope='session')
def micro_project(tmp_path_factory):
    """A scratch project root: settings.ini (profiles `micro-test` and `micro-test-old-layout`), models/ (CLIP,
    experts, and their transformers-4 copies), datasets/ (one per task of `MICRO_TASKS`), nbs/experiments (a link)."""
    from fusion_nb.tiny.clip_factory import make_clip_dir, make_expert_dirs
    root = tmp_path_factory.mktemp('micro_project')
    words = [t.format(c) for cs in MICRO_TASKS.values() for c in cs for t in MICRO_TEMPLATES]
    make_clip_dir(root/'models'/'clip', words, seed=0)
    experts = make_expert_dirs(root/'models'/'clip', str(root/'models'/'expert_{task}'), list(MICRO_TASKS), noise=0.05)
    save_transformers4_layout(root/'models'/'clip', root/'models'/'old_clip', prefix_vision=False)
    for task, d in experts.items():
        save_transformers4_layout(d, root/'models'/f'old_expert_{task}', prefix_vision=True)
    for i, (task, classes) in enumerate(MICRO_TASKS.items()):
        micro_dataset(root/'datasets'/task, classes, MICRO_MODES[task], seed=i)
    (root/'settings.ini').write_text(SETTINGS.format(tasks=' '.join(MICRO_TASKS)))
    (root/'nbs').mkdir()
    (root/'nbs'/'experiments').symlink_to(REPO/'nbs'/'experiments')
    return root

from fusion_nb.tiny.build import MICRO_POOL_TASKS
MICRO_BENCH_TASKS = list(MICRO_POOL_TASKS)   # the three experts of the micro pool

@pytest.fixture(scope='session')
def micro_pools():
    "Three experts of the repo's micro benchmark (built once into data/micro and shared), their pools, θ₀ and a seeded MergeData."
    from fusion_nb.tiny.build import micro_pool
    mp = micro_pool(root=REPO)   # the notebooks' micro pool, the same three experts
    return dict(models=mp.models, tasks=mp.tasks, pre=mp.pre, experts=mp.experts, data=mp.data)

# --- running on several workers (pytest-xdist, `make test`'s `-n auto --dist loadfile`) ----------------------------------
# Each file runs whole on one worker (its module fixtures are built once). Files that read or build the same zoo under the
# repository's data/ on first use take that zoo's lock for as long as they run, so two workers never build one zoo at once.
# (xdist's `loadgroup` would be the direct way; with pytest 9.2 and xdist 3.8 its groups are not honoured: tests of one
# xdist_group ran on both workers.)
SHARED_BUILDS = {'robust': ['test_robust_experiments', 'test_robust_zoo', 'test_robust_models'],   # test_robust_paper_scale: its own root
                 'neulig': ['test_neulig', 'test_neulig_experiment', 'test_second_backbone'],
                 'llava': ['test_llava', 'test_llava_benchmarks', 'test_llava_experiment', 'test_llava_paper_values']}
GROUP_OF = {f: g for g, files in SHARED_BUILDS.items() for f in files}

@pytest.fixture(scope='module', autouse=True)
def one_builder_per_zoo(request):
    "Under xdist, hold the file's zoo lock (one per checkout and zoo) while the file runs."
    group = GROUP_OF.get(request.path.stem)
    if group is None or not os.environ.get('PYTEST_XDIST_WORKER'):
        yield; return
    import hashlib, tempfile
    from filelock import FileLock
    key = hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
    with FileLock(str(Path(tempfile.gettempdir())/f'fusion_nb-tests-{key}-{group}.lock')): yield

# The longest files first. xdist hands files to the workers in collection order when told not to reorder them (the
# Makefile's --no-loadscope-reorder); by default it sorts them by their number of tests, which sent the few-test,
# minute-long files (a whole experiment each) last and left one worker idle while the other finished them. Worker-seconds
# per file from CI's `--durations` (stop 37, after that stop's cuts; approximate): only the order matters, files not listed
# keep theirs after these. Files of one zoo group (SHARED_BUILDS) are kept apart, so that they rarely wait on each other.
FILE_SECONDS = {'reproduce/test_reproduce.py': 170, 'test_bad_inputs.py': 80, 'llava/test_llava_experiment.py': 78,
                'reproduce/test_hub_mirror.py': 40, 'robust/test_robust_experiments.py': 73, 'reproduce/test_tracking.py': 60,
                'reproduce/test_ray.py': 66, 'masking/test_masking_imagenet.py': 50, 'neulig/test_neulig_experiment.py': 49,
                'reproduce/test_experiments.py': 46, 'reproduce/test_fusion_experiments.py': 45, 'masking/test_masking.py': 34,
                'llava/test_llava_benchmarks.py': 30, 'tiny/test_benchmark.py': 25, 'tiny/test_tiny_zoo.py': 15,
                'reproduce/test_sweep.py': 16, 'neulig/test_merge_vs_ensemble.py': 16, 'reproduce/test_logs.py': 12,
                'reproduce/test_merge_cli.py': 11, 'robust/test_robust_paper_scale.py': 75, 'test_docs.py': 68}   # these two: their long tests, marked slow, run in make test-all only

def pytest_collection_modifyitems(config, items):
    "Order the files longest first (a stable sort: each file's tests keep their order, unlisted files theirs)."
    items.sort(key=lambda item: -FILE_SECONDS.get(Path(item.path).relative_to(REPO/'tests').as_posix(), 0))

def pytest_sessionstart(session):
    "The repository's micro benchmark, built before any worker starts (every worker reads it; none may build it twice)."
    if hasattr(session.config, 'workerinput') or not session.config.pluginmanager.hasplugin('xdist'): return
    if getattr(session.config.option, 'numprocesses', None) in (None, 0): return
    from fusion_nb.tiny.build import build_benchmark
    build_benchmark('micro', root=REPO, progress=False, log=lambda s: None)
