"Table s6's second tiny backbone at micro scale: another architecture, built on first use, byte-identical on a rebuild, merged by the same code."
import dataclasses, json, os, shutil
from pathlib import Path
os.environ.setdefault('HF_HUB_OFFLINE', '1')

import pytest, torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

from fusion_nb.catalog import templates_for
from fusion_nb.checkpoints import load_vision_model, vision_config
from fusion_nb.core import FusionError, IncompatibleModelsError, UnknownNameError
from fusion_nb.evaluation import evaluate, zeroshot_head
from fusion_nb.merge import merge
from fusion_nb.pools import PRETRAINED, ModelPool, TaskPool, load_split
from fusion_nb.reproduce.profiles import load_profile
from fusion_nb.tiny.build import build_benchmark
from fusion_nb.neulig.second_backbone import (SECOND_BACKBONE, backbone_accuracy, backbone_models, backbone_profile,
                                            build_second_backbone, profile_backbones, second_backbone_dir)
from fusion_nb.tiny.tasks import NEULIG_TASKS

REPO = Path(__file__).resolve().parents[2]
SHAPE = ('hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads')

def project_copy(root:Path)->Path:
    "A project at `root` sharing the repository's settings, notebooks and micro benchmark (read only), with its own second backbone."
    build_benchmark('micro', REPO, progress=False, log=lambda s: None)   # the project's micro benchmark, built on first use
    (root/'data').mkdir(parents=True)
    (root/'data'/'micro').symlink_to(REPO/'data'/'micro', target_is_directory=True)
    (root/'nbs').symlink_to(REPO/'nbs', target_is_directory=True)   # the experiments' declared parameters (profile keys)
    shutil.copy(REPO/'settings.ini', root/'settings.ini')
    return root

@pytest.fixture(scope='module')
def project(tmp_path_factory):
    root = project_copy(tmp_path_factory.mktemp('second_backbone'))
    P = load_profile('micro', settings=root/'settings.ini', tasks=NEULIG_TASKS)
    with pytest.MonkeyPatch.context() as mp:   # built on first use, from the checkout's pins (training it is notebook 74's test)
        mp.setenv('FUSION_NB_PINS', str(REPO/'pins'))
        return root, P, backbone_profile(P, 1)

def manifest(root): return json.loads((second_backbone_dir('micro', root)/'manifest.json').read_text())

def test_built_on_first_use_where_the_profile_says(project):
    root, P, P1 = project
    assert profile_backbones(P) == ['clip-vit-tiny', SECOND_BACKBONE]
    assert P1.pretrained == str(root/'data'/'second_backbone'/'micro'/'models'/SECOND_BACKBONE)
    assert P1.experts == {t: str(root/'data'/'second_backbone'/'micro'/'models'/f'{SECOND_BACKBONE}_{t}') for t in NEULIG_TASKS}
    assert (P1.tasks, P1.datasets, P1.batch_size, P1.device) == (P.tasks, P.datasets, P.batch_size, P.device)
    m = manifest(root)
    assert m['rebuilt_now'] == {'clip': False, 'experts': [], 'from_pins': True} and m['expert_tasks'] == NEULIG_TASKS
    assert not (REPO/'data'/'micro'/'second_backbone').exists()   # nothing written into the shared benchmark

def test_architecture_differs(project):
    _, P, P1 = project
    c1, c2 = vision_config(P.pretrained), vision_config(P1.pretrained)
    assert all(getattr(c1, k) != getattr(c2, k) for k in SHAPE), [(getattr(c1, k), getattr(c2, k)) for k in SHAPE]
    pre1, pre2 = backbone_models(P, 0, tasks=[])[0], backbone_models(P, 1, tasks=[])[0]
    assert set(pre2) - set(pre1)   # another depth: tensors the first backbone lacks
    common = set(pre1) & set(pre2)
    assert common and all(pre1.shape(k) != pre2.shape(k) for k in common), [k for k in common if pre1.shape(k) == pre2.shape(k)]

def test_experts_load_through_the_pools(project):
    _, P, P1 = project
    pre, experts = backbone_models(P, 1)
    assert list(experts) == NEULIG_TASKS
    for t, e in experts.items():
        assert set(e) == set(pre) and all(e.shape(k) == pre.shape(k) for k in pre)
        assert any(not torch.equal(e[k], pre[k]) for k in pre), t   # fine-tuned: not the pretrained encoder
    pool = ModelPool.from_profile(P1)
    enc = pool.vision_model('svhn')
    assert enc.config.hidden_size == vision_config(P1.pretrained).hidden_size
    assert not any('text' in k for k in load_file(Path(P1.experts['svhn'])/'model.safetensors'))   # a CLIPVisionModel

def test_accuracy_table_of_percentages(project):
    _, P, _ = project
    acc = backbone_accuracy(P, 1, max_samples=0)
    assert list(acc.index) == ['Pre-trained', 'Fine-tuned'] and list(acc.columns) == [*NEULIG_TASKS, 'Avg.']
    assert ((acc >= 0) & (acc <= 100)).all().all() and acc.loc['Pre-trained', 'Avg.'] == pytest.approx(acc.loc['Pre-trained', NEULIG_TASKS].mean())

def test_experts_beat_the_pretrained_model(project):
    """Each expert fits its own task better than the pretrained model: a lower cross-entropy on that task's training split.
    (Micro trains 20 steps on 40 images and tests on 20: its test accuracies move by one or two images, too few to compare.)"""
    _, P, _ = project
    Pk = backbone_profile(dataclasses.replace(P, test_split='train'), 1)
    rows = {'pretrained': PRETRAINED, **{f'expert:{t}': t for t in NEULIG_TASKS}}
    rec = evaluate(rows, ModelPool.from_profile(Pk), TaskPool.from_profile(Pk), progress=False,
                   tasks={r: [r.split(':')[1]] if ':' in r else NEULIG_TASKS for r in rows})
    loss = rec[rec['metric'] == 'loss'].assign(row=lambda d: d['model'].str.split(':').str[0]).pivot_table(index='row', columns='task', values='value')
    assert (loss.loc['expert', NEULIG_TASKS] < loss.loc['pretrained', NEULIG_TASKS] - 0.05).all(), loss.round(3).to_string()
    acc = rec[rec['metric'] == 'accuracy'].assign(row=lambda d: d['model'].str.split(':').str[0]).pivot_table(index='row', columns='task', values='value')
    assert acc.loc['expert'].mean() > acc.loc['pretrained'].mean(), acc.round(3).to_string()

def test_fine_tuned_accuracy_matches_a_naive_loop(project):
    "The Fine-tuned row, recomputed image by image from the pretrained text head and the expert's features."
    _, P, P1 = project
    acc = backbone_accuracy(P, 1, tasks=['mnist'], max_samples=0)
    clip = CLIPModel.from_pretrained(P1.pretrained).eval()
    tok, proc = AutoTokenizer.from_pretrained(P1.pretrained), AutoImageProcessor.from_pretrained(P1.pretrained)
    ds = load_split(P1.datasets['mnist'], 'test', 'mnist')
    head, enc = zeroshot_head(clip, tok, ds.features['label'].names, templates_for('mnist')), load_vision_model(P1.experts['mnist'])
    right = 0
    with torch.no_grad():
        for ex in ds:
            x = proc(images=[ex['image'].convert('RGB')], return_tensors='pt')['pixel_values']
            right += int((F.normalize(clip.visual_projection(enc(pixel_values=x).pooler_output), dim=-1) @ head.T).argmax() == ex['label'])
    assert acc.loc['Fine-tuned', 'mnist'] == pytest.approx(100 * right / len(ds), abs=1e-6)

def test_task_arithmetic_merges_the_second_backbone(project):
    _, P, _ = project
    pre, experts = backbone_models(P, 1)
    merged = merge('task_arithmetic', pre, experts, scaling_factor=0.3, progress=False)
    k = next(k for k in pre if k.endswith('mlp.fc1.weight'))
    expected = pre[k] + 0.3 * sum(e[k] - pre[k] for e in experts.values())   # θ₀ + λ Σ (θᵢ − θ₀), by hand
    assert torch.allclose(merged[k], expected, atol=1e-6)
    assert {k: tuple(v.shape) for k, v in merged.items()} == {k: pre.shape(k) for k in pre}

def test_mixing_backbones_is_refused_naming_the_culprit(project):
    _, P, _ = project
    pre, experts = backbone_models(P, 1)
    first = backbone_models(P, 0, tasks=['mnist'])[1]['mnist']
    with pytest.raises(IncompatibleModelsError, match="'mnist_of_backbone_0'"):
        merge('task_arithmetic', pre, {**experts, 'mnist_of_backbone_0': first}, progress=False)
    with pytest.raises(IncompatibleModelsError):   # the other way round too: a second-backbone expert among the first's
        merge('task_arithmetic', backbone_models(P, 0, tasks=[])[0], {'mnist': first, 'svhn_b': experts['svhn']}, progress=False)

def test_bad_backbone_requests(project):
    root, P, _ = project
    with pytest.raises(UnknownNameError, match=r"profile 'micro' has no backbone 2; its backbones: 0 \(clip-vit-tiny\), 1 \(clip-vit-tiny-b\)"):
        backbone_profile(P, 2)
    with pytest.raises(UnknownNameError, match="has no backbone 1; its backbones: 0 .*A second one is named by the keys second_expert_template, second_pretrained"):
        backbone_profile(load_profile('clip-vit-b32', settings=root/'settings.ini'), 1)
    with pytest.raises(FusionError, match=r"second_expert_template = './x' must name each expert with '\{task\}'"):
        backbone_profile(load_profile('micro', settings=root/'settings.ini', second_expert_template='./x'), 1, build=False)
    with pytest.raises(UnknownNameError, match=r"profile 'micro' has no expert for task\(s\) \['sun397', 'stanford_cars', 'eurosat', 'dtd'\]"):
        backbone_models(load_profile('micro', settings=root/'settings.ini'), 1)   # paper 000's eight tasks: four lack a second-backbone expert
    with pytest.raises(FusionError, match="unknown key 'second_pretraind' \\(did you mean 'second_pretrained'"):
        load_profile('micro', settings=root/'settings.ini', second_pretraind='./x')
