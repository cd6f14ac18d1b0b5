"Export of merged models: folders that plain transformers reload to the same weights and outputs, their model cards, atomic writes, and the upload path up to the network."
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from huggingface_hub import ModelCard
from safetensors import safe_open
from transformers import AutoProcessor, CLIPModel, CLIPVisionModel

from fusion_nb.core import FusionError
from fusion_nb.checkpoints import vision_config, vision_state_dict
from fusion_nb.merge import ensemble, merge
from fusion_nb.reproduce import export
from fusion_nb.reproduce.export import export_model, model_card, push_to_hub
from fusion_nb.tiny.build import build_benchmark

REPO = Path(__file__).resolve().parents[2]
TASKS = ('mnist', 'svhn', 'eurosat')

@pytest.fixture(scope='module')
def micro():
    "The micro benchmark's base CLIP and three experts, and their TIES merge (paper 000's settings)."
    models = build_benchmark('micro', root=REPO, progress=False)/'models'
    base, experts = models/'clip-vit-tiny', {t: models/f'clip-vit-tiny_{t}' for t in TASKS}
    merged = merge('ties_merging', vision_state_dict(base), {t: vision_state_dict(d) for t, d in experts.items()},
                   k=20, scaling_factor=0.3, progress=False)
    return dict(base=base, experts=experts, merged=merged)

def images(n=3, seed=0):
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed)) * 2 - 1

def by_hand_vision(micro):
    "A CLIPVisionModel with the merged weights, built without the export: the base's config and load_state_dict."
    m = CLIPVisionModel(vision_config(micro['base'])).eval()
    m.load_state_dict(dict(micro['merged']), strict=True)
    return m

# ---------------------------------------------------------------- the folder reloads to the same model

def test_vision_export_reloads_identical_weights_and_outputs(micro, tmp_path):
    out = export_model(micro['merged'], tmp_path/'ties', base_model=micro['base'], experts=micro['experts'])
    reloaded = CLIPVisionModel.from_pretrained(out).eval()
    sd = reloaded.state_dict()
    assert set(sd) == set(micro['merged'])
    for k, v in micro['merged'].items(): assert torch.equal(sd[k], v), k
    x = images()
    with torch.no_grad():
        a, b = reloaded(pixel_values=x), by_hand_vision(micro)(pixel_values=x)
    assert torch.equal(a.pooler_output, b.pooler_output) and torch.equal(a.last_hidden_state, b.last_hidden_state)
    # the base model's preprocessing travels with it
    proc = AutoProcessor.from_pretrained(out)
    assert proc.to_dict()['crop_size'] == AutoProcessor.from_pretrained(micro['base']).image_processor.to_dict()['crop_size']

def test_clip_export_keeps_the_base_text_tower_and_gives_the_same_logits(micro, tmp_path):
    out = export_model(micro['merged'], tmp_path/'ties_clip', base_model=micro['base'], experts=micro['experts'], kind='clip')
    whole = CLIPModel.from_pretrained(out).eval()
    base = CLIPModel.from_pretrained(micro['base']).eval()
    for k, v in base.state_dict().items():
        if not k.startswith('vision_model.'): assert torch.equal(whole.state_dict()[k], v), k
    by_hand = CLIPModel.from_pretrained(micro['base']).eval()
    by_hand.vision_model.load_state_dict(dict(micro['merged']), strict=True)
    proc = AutoProcessor.from_pretrained(out)
    text = proc(text=['a photo of a 1.', 'a photo of a 7.', 'a photo of a forest.'], return_tensors='pt', padding=True)
    x = images()
    with torch.no_grad():
        got, want = whole(**text, pixel_values=x).logits_per_image, by_hand(**text, pixel_values=x).logits_per_image
        changed = base(**text, pixel_values=x).logits_per_image
    assert got.shape == (3, 3) and torch.equal(got, want)
    assert not torch.allclose(got, changed)   # the vision tower really is the merged one

def test_dtype_is_honoured(micro, tmp_path):
    out = export_model(micro['merged'], tmp_path/'half', base_model=micro['base'], experts=micro['experts'], dtype='float16')
    with safe_open(out/'model.safetensors', framework='pt') as f:
        for k in f.keys(): assert torch.equal(f.get_tensor(k), micro['merged'][k].half()), k
    assert json.loads((out/'config.json').read_text())['dtype'] == 'float16'

@pytest.mark.parametrize('kind', ['vision', 'clip'])
def test_float16_overflow_is_refused_after_the_cast(micro, tmp_path, kind):
    "Issue 26.4: weights finite in float32 but beyond float16's range (65504) were saved as inf at rc 0; now named, nothing written."
    from fusion_nb.core import NonFiniteError
    big = {k: (v * 1e6 if k.endswith('fc1.weight') else v) for k, v in micro['merged'].items()}
    with pytest.raises(NonFiniteError, match=r"dtype float16: tensor '.*fc1.weight' holds \d+ NaN/Inf value\(s\) in torch.float16"):
        export_model(big, tmp_path/'half', base_model=micro['base'], experts=micro['experts'], dtype='float16', method='ties_merging', kind=kind)
    assert not (tmp_path/'half').exists()

def test_saved_files_honour_the_umask(micro, tmp_path):
    "Issue 26.14: model.safetensors was 0600 whatever the umask."
    import os
    old = os.umask(0o022)
    try: out = export_model(micro['merged'], tmp_path/'m', base_model=micro['base'], experts=micro['experts'])
    finally: os.umask(old)
    assert {oct(f.stat().st_mode & 0o777) for f in out.iterdir()} == {oct(0o644)}

# ---------------------------------------------------------------- the card and inputs.json

def test_card_carries_the_metadata_and_renders(micro, tmp_path):
    results = pd.DataFrame({'task': list(TASKS), 'accuracy': [0.61, 0.42, 0.33]})
    out = export_model(micro['merged'], tmp_path/'carded', base_model=micro['base'], experts=micro['experts'], results=results,
                       repo_id='someone/tiny-ties')
    card = ModelCard.load(out/'README.md')
    d = card.data.to_dict()
    assert d['library_name'] == 'transformers' and d['pipeline_tag'] == 'image-feature-extraction'
    assert {'fusion_nb', 'merge', 'ties_merging'} <= set(d['tags'])
    assert d['merge']['method'] == 'ties_merging' and d['merge']['base_model'] == str(micro['base'])
    assert d['merge']['experts'] == {t: str(p) for t, p in micro['experts'].items()}
    hp = d['merge']['hyperparameters']
    assert {k: hp[k] for k in ('scaling_factor', 'k', 'trim_scope', 'disjoint', 'delta_transform')} == {
        'scaling_factor': 0.3, 'k': 20, 'trim_scope': 'model', 'disjoint': 'mean', 'delta_transform': None}
    # the thresholds TIES computed (the magnitude of each task vector's top 20 %) are recorded as it used them
    assert set(hp['thresholds']) == set(TASKS) and all(t > 0 for t in hp['thresholds'].values())
    assert 'base_model' not in d   # local folders: nothing the Hub could link
    text = card.text
    assert '# mnist, svhn, eurosat merged with Ties-Merging' in text   # the declared label
    for t, acc in zip(TASKS, results.accuracy): assert f'| {t}' in text and str(acc) in text
    assert 'CLIPVisionModel.from_pretrained("someone/tiny-ties")' in text
    assert "paper 000" in text   # the defaults' sources, read from the declaration

def test_card_links_hub_models_as_a_merge():
    card = model_card('task_arithmetic', {'scaling_factor': 0.3}, 'openai/clip-vit-base-patch32',
                      {'svhn': 'tanganke/clip-vit-base-patch32_svhn', 'mnist': 'tanganke/clip-vit-base-patch32_mnist'}, kind='clip')
    d = card.data.to_dict()
    assert d['base_model'] == ['openai/clip-vit-base-patch32', 'tanganke/clip-vit-base-patch32_svhn', 'tanganke/clip-vit-base-patch32_mnist']
    assert d['base_model_relation'] == 'merge' and d['pipeline_tag'] == 'zero-shot-image-classification'
    assert 'CLIPModel.from_pretrained' in card.text
    assert ModelCard(str(card)).data.to_dict() == d   # renders and parses back

def test_inputs_json_is_the_runs(micro, tmp_path):
    run = tmp_path/'inputs.json'
    run.write_text(json.dumps({'notebook': 'abc', 'parameters': {'profile': 'micro'}, 'hash': '123'}))
    out = export_model(micro['merged'], tmp_path/'with_inputs', base_model=micro['base'], experts=micro['experts'], inputs=run)
    assert json.loads((out/'inputs.json').read_text()) == json.loads(run.read_text())
    out = export_model(micro['merged'], tmp_path/'own_inputs', base_model=micro['base'], experts=micro['experts'], card=False)
    rec = json.loads((out/'inputs.json').read_text())
    assert rec['method'] == 'ties_merging' and rec['hyperparameters']['k'] == 20 and not (out/'README.md').exists()

# ---------------------------------------------------------------- refusals and atomic writes

def test_results_that_are_not_one_model_are_refused(micro, tmp_path):
    with pytest.raises(FusionError, match='output-space ensemble is not one set of weights'):
        export_model(ensemble(None, {'a': micro['merged'], 'b': micro['merged']}), tmp_path/'e', base_model=micro['base'])
    moe = by_hand_vision(micro); moe.router = torch.nn.Linear(2, 2)
    with pytest.raises(FusionError, match="tensor\\(s\\) a CLIPVisionModel does not"):
        export_model(moe, tmp_path/'m', base_model=micro['base'], method='task_arithmetic')
    assert not any(tmp_path.iterdir())

def test_failure_leaves_nothing_and_foreign_folders_are_kept(micro, tmp_path):
    bad = {k: v[..., :1].clone() for k, v in micro['merged'].items()}
    with pytest.raises(FusionError, match='has shape'):
        export_model(bad, tmp_path/'bad', base_model=micro['base'], method='ties_merging')
    assert list(tmp_path.iterdir()) == []   # neither the folder nor a temporary
    mine = tmp_path/'mine'; mine.mkdir(); (mine/'notes.txt').write_text('keep me')
    with pytest.raises(FusionError, match='is not an earlier export'):
        export_model(micro['merged'], mine, base_model=micro['base'])
    assert (mine/'notes.txt').read_text() == 'keep me'

def test_an_earlier_export_is_replaced_whole(micro, tmp_path):
    out = tmp_path/'again'
    export_model(micro['merged'], out, base_model=micro['base'], experts=micro['experts'], kind='clip')
    ta = merge('task_arithmetic', vision_state_dict(micro['base']), {'mnist': vision_state_dict(micro['experts']['mnist'])}, progress=False)
    with pytest.raises(FusionError, match='would delete'):   # a vision export would drop the clip export's tokenizer files
        export_model(ta, out, base_model=micro['base'], experts={'mnist': micro['experts']['mnist']})
    export_model(ta, out, base_model=micro['base'], experts={'mnist': micro['experts']['mnist']}, kind='clip')
    assert ModelCard.load(out/'README.md').data.to_dict()['merge']['method'] == 'task_arithmetic'
    assert torch.equal(CLIPModel.from_pretrained(out).vision_model.state_dict()['post_layernorm.weight'], ta['post_layernorm.weight'])

# ---------------------------------------------------------------- pushing, up to the network call

class FakeHub:
    "Records the HfApi calls push_to_hub makes, answering as the Hub would."
    def __init__(self, fail=None): self.calls, self.fail = [], fail
    def create_repo(self, api, repo_id, **kw):
        from huggingface_hub.hf_api import RepoUrl
        self.calls.append(('create_repo', repo_id, kw)); return RepoUrl(f'https://huggingface.co/{repo_id}')
    def upload_folder(self, api, **kw):
        from huggingface_hub.hf_api import CommitInfo
        self.calls.append(('upload_folder', kw['repo_id'], kw))
        if self.fail: raise self.fail
        return CommitInfo(f"https://huggingface.co/{kw['repo_id']}/commit/abc123", 'msg', '', 'abc123')

@pytest.fixture
def fake_hub(monkeypatch):
    from huggingface_hub import HfApi
    hub = FakeHub()
    monkeypatch.setattr(HfApi, 'create_repo', lambda api, repo_id, **kw: hub.create_repo(api, repo_id, **kw))
    monkeypatch.setattr(HfApi, 'upload_folder', lambda api, **kw: hub.upload_folder(api, **kw))
    return hub

def test_push_uploads_the_folder(micro, tmp_path, monkeypatch, fake_hub):
    out = export_model(micro['merged'], tmp_path/'push', base_model=micro['base'], experts=micro['experts'])
    monkeypatch.setattr(export, 'hub_offline', lambda: False)
    monkeypatch.setattr(export, 'hub_reachable', lambda *a, **k: True)
    url = push_to_hub(out, 'someone/tiny-ties', private=True)
    assert url == 'https://huggingface.co/someone/tiny-ties/commit/abc123'
    (c1, r1, kw1), (c2, r2, kw2) = fake_hub.calls
    assert (c1, r1, kw1['private'], kw1['exist_ok'], kw1['repo_type']) == ('create_repo', 'someone/tiny-ties', True, True, 'model')
    assert (c2, r2, Path(kw2['folder_path']), kw2['repo_type']) == ('upload_folder', 'someone/tiny-ties', out, 'model')

def test_push_refused_login_is_one_clear_error(micro, tmp_path, monkeypatch, fake_hub):
    from huggingface_hub.errors import HfHubHTTPError
    out = export_model(micro['merged'], tmp_path/'push', base_model=micro['base'], experts=micro['experts'])
    monkeypatch.setattr(export, 'hub_offline', lambda: False)
    monkeypatch.setattr(export, 'hub_reachable', lambda *a, **k: True)
    refused = HfHubHTTPError.__new__(HfHubHTTPError)   # as the Hub raises it, without building an HTTP response
    Exception.__init__(refused, '401 Client Error: Unauthorized for url: https://huggingface.co/api/repos/create')
    fake_hub.fail = refused
    with pytest.raises(FusionError, match=r"failed: 401 Client Error: Unauthorized for url: \S+\. Log in .*hf auth login"):
        push_to_hub(out, 'someone/tiny-ties')

def test_push_offline_fails_before_any_call(micro, tmp_path, monkeypatch, fake_hub):
    out = export_model(micro['merged'], tmp_path/'push', base_model=micro['base'], experts=micro['experts'])
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    with pytest.raises(FusionError, match=r'Hub is not reachable \(HF_HUB_OFFLINE is set\).*hf upload someone/tiny-ties'):
        push_to_hub(out, 'someone/tiny-ties')
    with pytest.raises(FusionError, match='is not a hub repository id'):
        push_to_hub(out, 'no spaces allowed/x y')
    with pytest.raises(FusionError, match='is not an exported model'):
        push_to_hub(tmp_path, 'someone/tiny-ties')
    assert fake_hub.calls == []
