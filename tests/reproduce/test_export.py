"Export of merged models: folders that plain transformers reload to the same weights and outputs, their model cards, atomic writes, and the upload path up to the network."
import errno, json, re
from pathlib import Path

import pandas as pd
import pytest
import torch
from huggingface_hub import ModelCard
from safetensors import SafetensorError, safe_open
from transformers import AutoProcessor, CLIPModel, CLIPVisionModel

from fusion_nb.core import FusionError, human_bytes
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

# ---------------------------------------------------------------- issue 51: nothing lost, nothing silent

@pytest.mark.parametrize('name, message', [
    ('../notes.txt', "extra_files: '../notes.txt' is not a name inside the export folder"),
    ('sub/../../notes.txt', "extra_files: 'sub/../../notes.txt' is not a name inside the export folder"),
    ('{tmp}/notes.txt', "is not a name inside the export folder (an absolute path"),
    ('model.safetensors', "extra_files: 'model.safetensors' would replace model.safetensors, which the export writes itself"),
    ('README.md', "extra_files: 'README.md' would replace README.md, which the export writes itself"),
    ('inputs.json', "would replace inputs.json, which the export writes itself"),
    ('config.json/x', "would replace config.json, which the export writes itself"),
])
def test_issue_51_1_extra_files_stay_inside_the_folder_and_replace_nothing_it_writes(micro, tmp_path, name, message):
    "Item 1: '../notes.txt' overwrote the user's file beside the export; 'model.safetensors' replaced the weights."
    (tmp_path/'notes.txt').write_text("the user's"); src = tmp_path/'coefficients.pt'; src.write_text('learned')
    name = name.format(tmp=tmp_path)
    with pytest.raises(FusionError, match=re.escape(message)):
        export_model(micro['merged'], tmp_path/'out', base_model=micro['base'], experts=micro['experts'], extra_files={name: src})
    assert (tmp_path/'notes.txt').read_text() == "the user's" and not (tmp_path/'out').exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['coefficients.pt', 'notes.txt']   # no temporary left either

def test_issue_51_1_an_extra_file_named_like_one_a_clip_export_writes_is_refused(micro, tmp_path):
    src = tmp_path/'mine.json'; src.write_text('{}')
    with pytest.raises(FusionError, match=r"extra_files: 'tokenizer.json' would replace tokenizer.json, which the export writes itself"):
        export_model(micro['merged'], tmp_path/'out', base_model=micro['base'], kind='clip', extra_files={'tokenizer.json': src})
    assert not (tmp_path/'out').exists()
    out = export_model(micro['merged'], tmp_path/'ok', base_model=micro['base'], extra_files={'artefacts/mine.json': src})
    assert (out/'artefacts'/'mine.json').read_text() == '{}'   # a name inside the folder, of its own, is copied
    with pytest.raises(FusionError, match=r"extra_files\['notes.txt'\]: '.*nowhere.txt' is not a file"):
        export_model(micro['merged'], tmp_path/'x', base_model=micro['base'], extra_files={'notes.txt': tmp_path/'nowhere.txt'})

def test_issue_51_2_a_model_card_the_user_edited_is_never_replaced(micro, tmp_path):
    "Item 2: rerunning an export into an earlier one replaced the README.md the user had edited, silently."
    out, notes = tmp_path/'export', []
    export_model(micro['merged'], out, base_model=micro['base'], experts=micro['experts'])
    first = (out/'README.md').read_text()
    ta = merge('task_arithmetic', vision_state_dict(micro['base']), {'mnist': vision_state_dict(micro['experts']['mnist'])}, progress=False)
    export_model(ta, out, base_model=micro['base'], experts={'mnist': micro['experts']['mnist']}, log=notes.append)
    assert ModelCard.load(out/'README.md').data.merge['method'] == 'task_arithmetic'   # our own card, unedited: replaced
    assert not (out/export.CARD_BESIDE).exists() and notes == []
    edited = (out/'README.md').read_text().replace('## Models', 'Notes of mine, for the Hub.\n\n## Models')
    (out/'README.md').write_text(edited)
    export_model(micro['merged'], out, base_model=micro['base'], experts=micro['experts'], log=notes.append)
    assert (out/'README.md').read_text() == edited   # the user's card is kept, byte for byte ...
    beside = ModelCard.load(out/export.CARD_BESIDE)   # ... and this export's card is written beside it
    assert beside.data.merge['method'] == 'ties_merging' and beside.text.strip() == ModelCard(first).text.strip()
    assert len(notes) == 1 and 'README.md' in notes[0] and 'kept' in notes[0] and export.CARD_BESIDE in notes[0], notes
    (out/'README.md').write_text('# My own card, written by hand\n')   # one the user wrote: no mark of ours
    export_model(ta, out, base_model=micro['base'], experts={'mnist': micro['experts']['mnist']}, log=notes.append)
    assert (out/'README.md').read_text() == '# My own card, written by hand\n'
    assert ModelCard.load(out/export.CARD_BESIDE).data.merge['method'] == 'task_arithmetic'
    with pytest.raises(FusionError, match='would delete README.fusion_nb.md'):   # card=False: our card beside it is not dropped silently
        export_model(ta, out, base_model=micro['base'], experts={'mnist': micro['experts']['mnist']}, card=False)
    (out/export.CARD_BESIDE).unlink()
    export_model(ta, out, base_model=micro['base'], experts={'mnist': micro['experts']['mnist']}, card=False, log=notes.append)
    assert (out/'README.md').read_text() == '# My own card, written by hand\n' and not (out/export.CARD_BESIDE).exists()   # kept

def test_issue_51_2_fusion_nb_merge_rerun_keeps_the_edited_card(micro, tmp_path, monkeypatch, capsys):
    "Item 2 through `fusion-nb merge`, the way the issue found it."
    from fusion_nb.reproduce.cli import main
    monkeypatch.chdir(REPO)
    out = tmp_path/'ties'
    assert main(['merge', 'examples/merge/ties_micro.yaml', '-o', str(out), '--no-progress']) == 0
    edited = (out/'README.md').read_text() + '\nMy notes: tried on MNIST only.\n'
    (out/'README.md').write_text(edited)
    assert main(['merge', 'examples/merge/ties_micro.yaml', '-o', str(out), '--no-progress']) == 0
    assert (out/'README.md').read_text() == edited and (out/export.CARD_BESIDE).is_file()
    assert 'README.md' in capsys.readouterr().out

@pytest.mark.parametrize('kind', ['vision', 'clip'])
def test_issue_51_5_nan_is_refused_without_a_dtype(micro, tmp_path, kind):
    "Item 5: export_model without dtype= wrote NaN weights."
    from fusion_nb.core import NonFiniteError
    bad = dict(micro['merged']); k = 'encoder.layers.0.mlp.fc1.weight'; bad[k] = bad[k].clone(); bad[k].view(-1)[3] = float('nan')
    with pytest.raises(NonFiniteError, match=re.escape(f"tensor '{k}' holds 1 NaN/Inf value(s) in torch.float32")):
        export_model(bad, tmp_path/'nan', base_model=micro['base'], method='ties_merging', kind=kind)
    assert list(tmp_path.iterdir()) == []

@pytest.mark.parametrize('dtype', [torch.int8, torch.int64, torch.bool])
def test_issue_51_5_non_float_dtypes_are_refused(micro, tmp_path, dtype):
    "Item 5: dtype=torch.int8 wrote every float weight as integers (zeros)."
    with pytest.raises(FusionError, match=re.escape(f"dtype {dtype} is not a float dtype: export in one of float32, float16, bfloat16, float64")):
        export_model(micro['merged'], tmp_path/'int', base_model=micro['base'], experts=micro['experts'], dtype=dtype)
    assert list(tmp_path.iterdir()) == []

def test_issue_51_6_a_method_other_than_the_results_is_refused(micro, tmp_path):
    "Item 6: export_model(result, method='ties_merging') of a task-arithmetic result wrote a TIES card."
    ta = merge('task_arithmetic', vision_state_dict(micro['base']), {'mnist': vision_state_dict(micro['experts']['mnist'])}, progress=False)
    with pytest.raises(FusionError, match=re.escape("method='ties_merging', but the result was made by 'task_arithmetic' (its .info['method'])")):
        export_model(ta, tmp_path/'x', base_model=micro['base'], method='ties_merging')
    assert list(tmp_path.iterdir()) == []
    out = export_model(ta, tmp_path/'ok', base_model=micro['base'], method='task_arithmetic')   # naming its own method is fine
    assert ModelCard.load(out/'README.md').data.merge['method'] == 'task_arithmetic'

@pytest.mark.parametrize('error', [
    OSError(errno.ENOSPC, 'No space left on device'),
    SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')])
def test_issue_51_11_a_full_disk_names_the_folder_and_what_to_free(micro, tmp_path, monkeypatch, error):
    "Item 11: a full disk gave a raw SafetensorError; now the user's folder, how much to free, and nothing left behind."
    from fusion_nb import checkpoints
    def fills_the_disk(tensors, path, metadata=None):
        Path(path).write_bytes(b'0' * 1000); raise error
    monkeypatch.setattr(checkpoints, 'save_file', fills_the_disk)
    out = tmp_path/'my export'
    with pytest.raises(FusionError) as e:
        export_model(micro['merged'], out, base_model=micro['base'], experts=micro['experts'])
    need = sum(v.numel() * v.element_size() for v in micro['merged'].values())
    msg = str(e.value)
    assert msg.startswith(f"cannot write {str(out)!r}: no space left on its disk (it needs about {human_bytes(need)}"), msg
    assert 'Free at least' in msg and '.tmp' not in msg and isinstance(e.value, OSError)
    assert list(tmp_path.iterdir()) == []   # the partial output is removed

def test_issue_51_11_an_unwritable_folder_is_named_not_the_temporary(micro, tmp_path, monkeypatch):
    "Item 11: a read-only output folder gave `OSError ... '.out.<pid>.tmp'` (made by hand: root writes anywhere)."
    import tempfile
    def refused(*a, dir=None, prefix='', **k): raise PermissionError(errno.EACCES, 'Permission denied', str(Path(dir)/f'{prefix}x.tmp'))
    monkeypatch.setattr(tempfile, 'mkdtemp', refused)
    with pytest.raises(FusionError) as e:
        export_model(micro['merged'], tmp_path/'out', base_model=micro['base'], experts=micro['experts'])
    assert str(e.value).startswith(f"cannot write {str(tmp_path/'out')!r}: its folder {str(tmp_path)!r} is not writable (Permission denied). "
                                   "Choose a writable folder"), str(e.value)
