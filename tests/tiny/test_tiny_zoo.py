"The tiny zoo at micro scale: loaders on the built zoo, stale recipes rebuild, reproducible training, the accuracy check."
import json, os, shutil
from pathlib import Path
os.environ.setdefault('HF_HUB_OFFLINE', '1')

import pytest, torch
from safetensors.torch import load_file
from transformers import (AutoImageProcessor, AutoTokenizer, CLIPModel, CLIPTokenizer, CLIPTokenizerFast,
                          CLIPVisionModel)

from fusion_nb.tiny.build import build_benchmark, verify_benchmark, zoo_accuracy
from fusion_nb.catalog import templates_for
from fusion_nb.core import HyperparameterError, UnknownNameError
from fusion_nb.tiny.tasks import EIGHT_TASKS, TASKS
from fusion_nb.tiny.zoo import EXPERT_TASKS, deterministic, zoo_config

REPO = Path(__file__).resolve().parents[2]

@pytest.fixture(scope='module')
def built(tmp_path_factory):
    "A copy of the checkout's micro benchmark (conftest builds it once; building one from scratch is notebook 15's test)."
    root = tmp_path_factory.mktemp('zoo')
    build_benchmark('micro', REPO, progress=False, log=lambda s: None)   # built on first use when pytest runs without workers
    for part in ('datasets', 'models'): shutil.copytree(REPO/'data'/'micro'/part, root/'data'/'micro'/part)   # the benchmark, not the other zoos beside it
    shutil.copy(REPO/'data'/'micro'/'manifest.json', root/'data'/'micro'/'manifest.json')
    shutil.copy(REPO/'settings.ini', root/'settings.ini')   # a project: pins name its data
    return root, build_benchmark('micro', root, progress=False)   # complete: nothing rebuilt

def test_loaders_on_the_built_zoo(built):
    _, base = built
    clip_dir = base/'models'/'clip-vit-tiny'
    clip = CLIPModel.from_pretrained(clip_dir)
    proc = AutoImageProcessor.from_pretrained(clip_dir)
    for cls in (CLIPTokenizer, CLIPTokenizerFast, AutoTokenizer):
        tok = cls.from_pretrained(clip_dir)
        for t in EIGHT_TASKS:   # every prompt the benchmark makes: one token per word, no byte fallback
            for c in TASKS[t].classnames[:3]:
                p = templates_for(t)[0].format(c)
                assert all(x.endswith('</w>') for x in tok.tokenize(p)), p
    assert clip.config.vision_config.hidden_size == zoo_config('micro').hidden_size
    for t in EXPERT_TASKS:
        enc = CLIPVisionModel.from_pretrained(base/'models'/f'clip-vit-tiny_{t}')
        assert enc.config.hidden_size == clip.config.vision_config.hidden_size
    assert proc.crop_size == {'height': 32, 'width': 32}

def test_experts_keep_the_text_tower(built):
    "Only the vision encoder is fine-tuned: an expert directory holds no text weights and differs from the pretrained encoder."
    _, base = built
    pre = load_file(base/'models'/'clip-vit-tiny'/'model.safetensors')
    for t in ['svhn', 'dtd']:
        ex = load_file(base/'models'/f'clip-vit-tiny_{t}'/'model.safetensors')
        assert not any('text' in k for k in ex)
        assert any(not torch.equal(v, pre['vision_model.' + k.removeprefix('vision_model.')]) for k, v in ex.items())

def test_stale_zoo_recipe_rebuilds_models_only(built, tmp_path, monkeypatch):
    root, base = built
    before = json.loads((base/'manifest.json').read_text())
    build_benchmark('micro', root, progress=False, threads=1)            # another thread count: another zoo recipe
    after = json.loads((base/'manifest.json').read_text())
    assert after['rebuilt_now'] == {'datasets': [], 'corrupted': [], 'models': ['clip', *EXPERT_TASKS], 'models_from_pins': False}
    assert {k: v for k, v in after['files'].items() if k.startswith('datasets/')} == \
           {k: v for k, v in before['files'].items() if k.startswith('datasets/')}
    assert verify_benchmark('micro', root) == []
    monkeypatch.setenv('FUSION_NB_PINS', str(REPO/'pins'))
    build_benchmark('micro', root, progress=False, threads=before['threads'])   # back to the pinned recipe: restored, not trained
    back = json.loads((base/'manifest.json').read_text())
    bench = lambda m: {k: v for k, v in m['files'].items() if k.startswith(('datasets/', 'models/'))}   # the manifest also lists other zoos under data/micro
    assert bench(back) == bench(before) and back['rebuilt_now']['models_from_pins']

def test_zoo_accuracy_is_a_table_of_percentages(built):
    root, _ = built
    acc = zoo_accuracy('micro', root, tasks=['mnist', 'gtsrb'], progress=False)
    assert list(acc.columns) == ['mnist', 'gtsrb', 'avg'] and len(acc) == 4
    assert ((acc >= 0) & (acc <= 100)).all().all()
    assert acc.loc['zero-shot', 'avg'] == pytest.approx(acc.loc['zero-shot', ['mnist', 'gtsrb']].mean(), abs=0.06)

def test_deterministic_restores_and_checks():
    n = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with deterministic(1):
            assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
            raise RuntimeError('boom')
    assert torch.get_num_threads() == n and not torch.are_deterministic_algorithms_enabled()
    with pytest.raises(HyperparameterError, match='threads'):
        with deterministic(0): pass

def test_unknown_scale():
    with pytest.raises(UnknownNameError, match="unknown scale 'huge'"): build_benchmark('huge', '/nonexistent', progress=False)

def test_a_build_killed_in_its_training_child_resumes(built, tmp_path):
    "A build whose processes are killed (SIGKILL, as a stopped job) while its child trains keeps what it recorded; the next build resumes."
    import signal, subprocess, sys, time
    from fusion_nb.tiny.build import PROGRESS
    src, _ = built
    root = tmp_path/'project'
    for part in ('datasets', 'models'): shutil.copytree(src/'data'/'micro'/part, root/'data'/'micro'/part)
    for f in ('data/micro/manifest.json', 'settings.ini'): shutil.copy(src/f, root/f)
    base, code = root/'data'/'micro', "import sys; from fusion_nb.tiny.build import build_benchmark; build_benchmark('micro', sys.argv[1], progress=False, threads=1)"
    p = subprocess.Popen([sys.executable, '-c', code, str(root)], start_new_session=True, stdout=subprocess.DEVNULL)   # threads=1: a recipe with no pins, trained
    done, t0 = {}, time.time()
    while p.poll() is None and time.time() - t0 < 600:
        try: done = json.loads((base/PROGRESS).read_text())['done']
        except (OSError, ValueError, KeyError): done = {}
        if 'clip' in done and any(i.startswith('expert/') for i in done): break
        time.sleep(0.02)
    if p.poll() is None: os.killpg(p.pid, signal.SIGKILL)   # else the build ended first: said by the assertion below
    p.wait()
    assert p.returncode == -signal.SIGKILL, 'the build ended before it could be stopped'
    recorded = sorted(i for i in json.loads((base/PROGRESS).read_text())['done'] if i == 'clip' or i.startswith('expert/'))
    assert 'clip' in recorded and len(recorded) < 1 + len(EXPERT_TASKS)
    assert json.loads((base/'manifest.json').read_text())['threads'] != 1   # no manifest of the stopped build
    build_benchmark('micro', root, progress=False, threads=1, log=lambda s: None)   # trains in its child again
    m = json.loads((base/'manifest.json').read_text())
    assert m['threads'] == 1 and set(recorded) <= set(m['rebuilt_now']['resumed'])
    assert m['rebuilt_now']['models'] == [t for t in EXPERT_TASKS if f'expert/{t}' not in recorded]   # neither the CLIP nor a recorded expert trained again
    assert not (base/PROGRESS).exists() and verify_benchmark('micro', root) == []
