"The tiny benchmark at micro scale: built on first use by the real `micro` profile, loaded by the same loaders."
import json, os, shutil, subprocess, sys
from pathlib import Path

import pandas as pd
import pytest, torch
from datasets import ClassLabel, load_from_disk

from fusion_nb.tiny.build import ROBUSTNESS_CORRUPTIONS, ROBUSTNESS_TASKS, build_benchmark
from fusion_nb.checkpoints import vision_state_dict
from fusion_nb.tiny.tasks import EIGHT_TASKS, SCALES, TASKS

REPO = Path(__file__).resolve().parents[2]

@pytest.fixture(scope='module')
def project(tmp_path_factory):
    "A scratch checkout: the real settings.ini and experiments, an empty data/."
    root = tmp_path_factory.mktemp('checkout')
    shutil.copy(REPO/'settings.ini', root/'settings.ini')
    (root/'nbs').mkdir(); (root/'nbs'/'experiments').symlink_to(REPO/'nbs'/'experiments')
    return root

def test_reproduce_micro_builds_on_first_use(project):
    "A fresh checkout's first run: the datasets rendered, the zoo restored from the checkout's pins (training it is notebook 15's test)."
    env = {**os.environ, 'FUSION_NB_ROOT': str(project), 'FUSION_NB_PINS': str(REPO/'pins')}
    r = subprocess.run([sys.executable, '-c', 'import sys; from fusion_nb.reproduce.cli import main; raise SystemExit(main(sys.argv[1:]))',
                        'reproduce', '--profile', 'micro', '--only', '00_individual'], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    base = project/'data'/'micro'
    manifest = json.loads((base/'manifest.json').read_text())
    assert manifest['scale'] == 'micro' and set(manifest['tasks']) == set(TASKS) and set(EIGHT_TASKS) <= set(manifest['expert_tasks'])
    assert all(f in manifest['files'] for f in ['models/clip-vit-tiny/config.json', 'models/clip-vit-tiny_gtsrb/model.safetensors'])
    table = pd.read_csv(project/'outputs'/'micro'/'00_individual'/'table.csv', index_col=0)
    assert list(table.columns) == [*EIGHT_TASKS, 'Avg.'] and table.notna().all().all()
    assert '## 00_individual' in (project/'outputs'/'micro'/'REPORT.md').read_text()
    assert manifest['rebuilt_now']['models_from_pins'] and 'pretrain_s' not in manifest['timings']   # nothing was trained

def test_dataset_schema_and_sizes(project):
    for t in EIGHT_TASKS:
        dd = load_from_disk(str(project/'data'/'micro'/'datasets'/t))
        clean = {s: len(dd[s]) for s in dd if s in SCALES['micro']}
        assert clean == SCALES['micro']
        # the robustness tasks also carry one corrupted copy of the test split per corruption
        extra = set(dd) - set(clean)
        assert extra == (set(ROBUSTNESS_CORRUPTIONS) if t in ROBUSTNESS_TASKS else set())
        assert all(len(dd[c]) == SCALES['micro']['test'] and dd[c]['label'] == dd['test']['label'] for c in extra)
        assert isinstance(dd['test'].features['label'], ClassLabel)
        assert dd['test'].features['label'].names == list(TASKS[t].classnames)
        assert dd['test'][0]['image'].size == (32, 32)

def test_experts_share_the_pretrained_layout_and_differ(project):
    base = project/'data'/'micro'/'models'
    pre = vision_state_dict(base/'clip-vit-tiny')
    for t in ['mnist', 'dtd']:
        e = vision_state_dict(base/f'clip-vit-tiny_{t}')
        assert sorted(e) == sorted(pre)
        assert any(not torch.equal(e[k], pre[k]) for k in pre)   # fine-tuning changed the encoder

def test_noop_when_present(project):
    "A second build of a complete benchmark rebuilds nothing (that a rebuild from scratch gives the same bytes is notebook 15's test)."
    before = json.loads((project/'data'/'micro'/'manifest.json').read_text())
    build_benchmark('micro', project, progress=False)
    assert json.loads((project/'data'/'micro'/'manifest.json').read_text()) == before
