"`fusion-nb merge CONFIG.yaml -o OUT` on the micro benchmark's models: the shipped examples end to end, every training-free method from a config, the learning methods with a profile, and each kind of bad config named by its key."
import json, os, subprocess, sys
from pathlib import Path

import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from transformers import CLIPModel, CLIPVisionConfig, CLIPVisionModel

from fusion_nb.core import FusionError, HyperparameterError, IncompatibleModelsError, UnknownNameError
from fusion_nb.checkpoints import vision_config, vision_state_dict
from fusion_nb.merge import MERGE_METHODS
from fusion_nb.reproduce import export
from fusion_nb.reproduce.merge_config import load_merge_config, run_merge
from fusion_nb.reproduce.cli import main
from fusion_nb.tiny.build import build_benchmark

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO/'examples'/'merge'

@pytest.fixture(scope='module')
def micro():
    "The micro benchmark's models (built on first use)."
    models = build_benchmark('micro', root=REPO, progress=False)/'models'
    return dict(base=models/'clip-vit-tiny', **{t: models/f'clip-vit-tiny_{t}' for t in ('mnist', 'svhn', 'eurosat')})

@pytest.fixture
def at_root(monkeypatch):
    "Run from the project root: the examples' paths are relative to it."
    monkeypatch.chdir(REPO)

def vision_weights(folder):
    "The vision encoder's tensors of an exported folder, as plain transformers loads them."
    cfg = json.loads((Path(folder)/'config.json').read_text())
    if cfg['model_type'] == 'clip': return CLIPModel.from_pretrained(folder).vision_model.state_dict()
    return CLIPVisionModel.from_pretrained(folder).state_dict()

def lazy(micro, *names): return {n: vision_state_dict(micro[n]) for n in names}

# ---------------------------------------------------------------- the shipped examples

def test_cli_subprocess_runs_the_ties_example(micro, tmp_path):
    out = tmp_path/'ties'
    r = subprocess.run([sys.executable, '-c', 'import sys; from fusion_nb.reproduce.cli import main; sys.exit(main(sys.argv[1:]))',
                        'merge', 'examples/merge/ties_micro.yaml', '-o', str(out), '--no-progress'], cwd=REPO, capture_output=True,
                       text=True, env={**os.environ, 'PYTHONPATH': str(REPO), 'HF_HUB_OFFLINE': '1'}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f'mnist, svhn, eurosat merged with Ties-Merging → {out}' in r.stdout
    whole, base = CLIPModel.from_pretrained(out), CLIPModel.from_pretrained(micro['base'])
    for k, v in base.state_dict().items():   # output.model: clip keeps the base model's text tower and projections
        if not k.startswith('vision_model.'): assert torch.equal(whole.state_dict()[k], v), k
    experts = lazy(micro, 'mnist', 'svhn', 'eurosat')
    want = MERGE_METHODS['ties_merging'](vision_state_dict(micro['base']), experts, k=20, scaling_factor=0.3, progress=False)
    other = MERGE_METHODS['ties_merging'](vision_state_dict(micro['base']), experts, k=10, scaling_factor=0.3, progress=False)
    got = whole.vision_model.state_dict()
    for k in want: assert torch.equal(got[k], want[k]), k
    assert any(not torch.equal(got[k], other[k]) for k in want)   # the config's k reached the method
    card = ModelCard.load(out/'README.md').data.to_dict()
    assert card['merge']['method'] == 'ties_merging' and card['merge']['hyperparameters']['k'] == 20
    assert card['pipeline_tag'] == 'zero-shot-image-classification'
    rec = json.loads((out/'inputs.json').read_text())
    assert rec['config'] == yaml.safe_load((EXAMPLES/'ties_micro.yaml').read_text())
    assert rec['resolved']['models'] == {t: str(micro[t].resolve()) for t in ('mnist', 'svhn', 'eurosat')}
    assert len(rec['hash']) == 64 and set(rec['models']) == {'base_model', 'mnist', 'svhn', 'eurosat'}

def test_per_expert_task_arithmetic_example_is_the_formula(micro, tmp_path, at_root):
    out = run_merge(EXAMPLES/'task_arithmetic_per_expert_micro.yaml', tmp_path/'ta', progress=False, log=lambda s: None)
    got, pre = vision_weights(out), vision_state_dict(micro['base'])
    lam = {'mnist': 0.5, 'svhn': 0.2, 'eurosat': 0.3}   # eurosat: the common value under `parameters`
    ex = lazy(micro, *lam)
    for k in pre:
        want = pre[k].double() + sum(l * (ex[t][k].double() - pre[k].double()) for t, l in lam.items())
        torch.testing.assert_close(got[k].double(), want, rtol=0, atol=1e-6)
    assert ModelCard.load(out/'README.md').data.to_dict()['merge']['hyperparameters'] == {'scaling_factor': lam}

@pytest.mark.parametrize('name', sorted(n for n in MERGE_METHODS.names() if MERGE_METHODS[n].kind == 'training-free'
                                        and MERGE_METHODS[n].name == n))
def test_every_training_free_method_runs_from_a_config(micro, tmp_path, name):
    m = MERGE_METHODS[name]
    experts = ['mnist'] if m.max_experts == 1 else ['mnist', 'svhn']
    cfg = {'method': name, 'base_model': str(micro['base']), 'models': [{'model': str(micro[t]), 'name': t} for t in experts]}
    out = run_merge(cfg, tmp_path/name, progress=False, log=lambda s: None)
    want = m(vision_state_dict(micro['base']), lazy(micro, *experts), progress=False)
    got = vision_weights(out)
    assert set(got) == set(want)
    for k in want: assert torch.equal(got[k], want[k]), (name, k)
    assert ModelCard.load(out/'README.md').data.to_dict()['merge']['method'] == name

def test_without_a_base_model_the_first_expert_gives_the_architecture(micro, tmp_path):
    cfg = {'method': 'weighted_average', 'models': [{'model': str(micro['mnist']), 'name': 'mnist', 'parameters': {'weights': 0.25}},
                                                    {'model': str(micro['svhn']), 'name': 'svhn', 'parameters': {'weights': 0.75}}]}
    out = run_merge(cfg, tmp_path/'avg', progress=False, log=lambda s: None)
    got, ex = vision_weights(out), lazy(micro, 'mnist', 'svhn')
    for k in got: torch.testing.assert_close(got[k], 0.25 * ex['mnist'][k] + 0.75 * ex['svhn'][k], rtol=0, atol=1e-6)
    card = ModelCard.load(out/'README.md')
    assert card.data.to_dict()['merge']['base_model'] is None and 'No base model' in card.text

# ---------------------------------------------------------------- learning methods draw the profile's data

def test_regmean_of_one_expert_is_that_expert(micro, tmp_path, at_root):
    "RegMean with one expert solves G W' = G W: the expert itself, whatever its Gram matrices (an independent check)."
    cfg = yaml.safe_load((EXAMPLES/'regmean_micro.yaml').read_text())
    cfg['models'] = [{'model': './data/micro/models/clip-vit-tiny_mnist'}]   # the name comes from the profile: mnist
    out = run_merge(cfg, tmp_path/'regmean', progress=False, log=lambda s: None)
    got, expert = vision_weights(out), vision_state_dict(micro['mnist'])
    for k in expert: torch.testing.assert_close(got[k], expert[k], rtol=1e-4, atol=1e-5)
    card = ModelCard.load(out/'README.md').data.to_dict()['merge']
    assert card['experts'] == {'mnist': str(micro['mnist'].resolve())}
    assert card['hyperparameters']['num_regmean_examples'] == 16 and card['hyperparameters']['batch_size'] == 8   # micro's budgets
    assert 'data' in json.loads((out/'inputs.json').read_text())

def test_adamerging_saves_what_it_learned_and_it_redoes_the_merge(micro, tmp_path, at_root):
    cfg = {'method': 'layer_wise_adamerging', 'profile': 'micro', 'base_model': './data/micro/models/clip-vit-tiny',
           'models': [{'model': './data/micro/models/clip-vit-tiny_mnist'}, {'model': './data/micro/models/clip-vit-tiny_svhn'}]}
    out = run_merge(cfg, tmp_path/'lw', progress=False, log=lambda s: None)
    learned = out/'artefacts'/'layer_wise_adamerging.safetensors'
    assert learned.is_file()
    assert ModelCard.load(out/'README.md').data.to_dict()['merge']['hyperparameters']['steps'] == 3   # micro's adamerging_steps
    again = MERGE_METHODS['layer_wise_adamerging'](vision_state_dict(micro['base']), lazy(micro, 'mnist', 'svhn'),
                                                   coefficients=learned, progress=False)
    got = vision_weights(out)
    for k in again: torch.testing.assert_close(got[k], again[k], rtol=0, atol=1e-6)
    plain = MERGE_METHODS['task_arithmetic'](vision_state_dict(micro['base']), lazy(micro, 'mnist', 'svhn'), progress=False)
    assert any(not torch.allclose(got[k], plain[k]) for k in plain)   # three steps moved the coefficients off their 0.3 start

# ---------------------------------------------------------------- bad configs: named by their key, nothing written

@pytest.fixture(scope='module')
def wide_model(tmp_path_factory, micro):
    "A CLIPVisionModel twice as wide as the micro models."
    d = tmp_path_factory.mktemp('wide')/'wide'
    CLIPVisionModel(CLIPVisionConfig(**{**vision_config(micro['base']).to_dict(), 'hidden_size': 64})).save_pretrained(d)
    return d

def good(micro):
    return {'method': 'ties_merging', 'base_model': str(micro['base']),
            'models': [{'model': str(micro['mnist']), 'name': 'mnist'}, {'model': str(micro['svhn']), 'name': 'svhn'}]}

BAD = [  # (change to the good config, error type, message)
    ({'method': 'tie_merging'}, UnknownNameError, "bad.yaml: method: unknown merge method 'tie_merging'. Did you mean 'ties_merging'"),
    ({'paramters': {'k': 20}}, FusionError, "bad.yaml: unknown key 'paramters' (did you mean 'parameters'?)"),
    ({'output': {'modle': 'clip'}}, FusionError, "bad.yaml: output: unknown key 'modle' (did you mean 'model'?)"),
    ({'models': [{'model': './missing/expert'}]}, FusionError, "bad.yaml: models[0].model: model folder './missing/expert' does not exist"),
    ({'parameters': {'k': 120}}, HyperparameterError, 'bad.yaml: ties_merging: k=120 is out of range'),
    ({'parameters': {'trim_scope': 'layer'}}, HyperparameterError, "trim_scope='layer' is not one of 'model', 'tensor'"),
    ({'method': 'task_arithmetic', 'models': [{'model': 'MNIST', 'parameters': {'scaling': 0.5}}]}, FusionError,
     "models[0] (clip-vit-tiny_mnist).parameters: 'scaling' is not a per-model parameter of task_arithmetic (did you mean 'scaling_factor'?)"),
    ({'models': [{'model': 'MNIST'}, {'model': 'WIDE'}]}, IncompatibleModelsError,
     'models[1] (wide) (WIDE) does not have the architecture of base_model: hidden_size 64 ≠ 32'),
    ({'method': 'fisher_merging'}, FusionError, 'fisher_merging is data-based: it needs data, so the config must name a profile'),
    ({'method': 'regmean', 'profile': 'mikro'}, UnknownNameError, "bad.yaml: profile: unknown profile 'mikro'"),
    ({'method': 'regmean', 'profile': 'micro', 'models': [{'model': 'MNIST', 'name': 'digits'}]}, FusionError,
     "models: 'digits' not a task of profile 'micro'"),
    ({'method': 'greedy_soup'}, FusionError, 'greedy_soup cannot be merged into one model: it selects with a Python evaluation function'),
    ({'dtype': 'int8'}, UnknownNameError, "bad.yaml: dtype: unknown dtype 'int8'"),
    ({'parameters': {'save_to': 'x.safetensors'}}, FusionError, "parameters: 'save_to' cannot be set in a config"),
    ({'models': []}, FusionError, 'bad.yaml: models: the list is empty: give the experts'),
    ({'base_model': 'fusion-nb-tests/no-such-model'}, FusionError,
     "base_model: model 'fusion-nb-tests/no-such-model' is not in the local Hugging Face cache and the hub is offline"),
    ({'output': {'push_to_hub': 'someone/two words'}}, FusionError, "bad.yaml: output.push_to_hub: 'someone/two words' is not a hub repository id"),
    ({'output': {'push_to_hub': 'someone/ties'}}, FusionError, 'the Hugging Face Hub is not reachable (HF_HUB_OFFLINE is set)'),
    # issue 26.13: NeuLig trained Portland, then failed at export; now refused when the config is read
    ({'method': 'neulig', 'profile': 'micro'}, FusionError, 'bad.yaml: method: neulig cannot be merged into one model'),
    # issue 26.8: 1e39 is finite in Python but overflows float32 in the merge (a raw RuntimeError)
    ({'method': 'task_arithmetic', 'parameters': {'scaling_factor': 1e39}}, HyperparameterError,
     'bad.yaml: parameters: scaling_factor=1e+39 is out of range: merges compute in float32'),
    # mergekit's schema: a method this project lacks, passthrough without slices, slices beside models are named
    ({'method': None, 'merge_method': 'nearswap'}, FusionError, "bad.yaml: merge_method: 'nearswap' is mergekit's, and this project lacks it"),
    ({'method': None, 'merge_method': 'passthrough'}, FusionError, "bad.yaml: merge_method: passthrough copies layers, so it needs slices:"),
    ({'method': None, 'merge_method': 'ties', 'slices': [{'sources': [{'model': 'MNIST', 'layer_range': [0, 2]}]}]}, FusionError,
     "bad.yaml: models and slices: give one of them"),
]

@pytest.mark.parametrize('change,error,message', BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_config_is_named_and_nothing_is_written(micro, wide_model, tmp_path, at_root, monkeypatch, change, error, message):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    cfg = {k: v for k, v in {**good(micro), **change}.items() if v is not None}
    subst = {'MNIST': str(micro['mnist']), 'WIDE': str(wide_model)}
    cfg['models'] = [{**e, 'model': subst.get(e['model'], e['model'])} for e in cfg['models']]
    message = message.replace('WIDE', str(wide_model))
    (tmp_path/'bad.yaml').write_text(yaml.safe_dump(cfg))
    with pytest.raises(error) as e: run_merge(tmp_path/'bad.yaml', tmp_path/'out', progress=False)
    assert message in str(e.value), str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['bad.yaml']

def test_not_yaml_and_not_a_mapping(tmp_path):
    (tmp_path/'broken.yaml').write_text('method: ties_merging\nmodels: [unclosed\n')
    with pytest.raises(FusionError, match=r"broken.yaml: not valid YAML \(line 3, column 1\): expected ',' or '\]', but got '<stream end>'$"):
        load_merge_config(tmp_path/'broken.yaml')
    (tmp_path/'list.yaml').write_text('- method: ties_merging\n')
    with pytest.raises(FusionError, match='list.yaml: a merge config is a mapping of keys'):
        load_merge_config(tmp_path/'list.yaml')
    with pytest.raises(FusionError, match="merge config '.*nowhere.yaml' does not exist"):
        load_merge_config(tmp_path/'nowhere.yaml')

def test_cli_bad_config_exits_2_with_one_line(micro, tmp_path, capsys):
    (tmp_path/'bad.yaml').write_text(yaml.safe_dump({**good(micro), 'parameters': {'k': 0}}))
    assert main(['merge', str(tmp_path/'bad.yaml'), '-o', str(tmp_path/'out')]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('fusion-nb: error: bad.yaml: ties_merging: k=0 is out of range') and '\n' not in err
    assert not (tmp_path/'out').exists()

def test_output_folder_that_is_not_an_export_is_kept(micro, tmp_path):
    mine = tmp_path/'mine'; mine.mkdir(); (mine/'notes.txt').write_text('keep me')
    with pytest.raises(FusionError, match='is not an earlier export'): run_merge(good(micro), mine, progress=False)
    assert [p.name for p in mine.iterdir()] == ['notes.txt']

def test_push_to_hub_option_uploads_the_export(micro, tmp_path, monkeypatch):
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import CommitInfo, RepoUrl
    calls = []
    monkeypatch.setattr(HfApi, 'create_repo', lambda api, repo_id, **kw: calls.append(('create', repo_id, kw['private'])) or RepoUrl(f'https://huggingface.co/{repo_id}'))
    monkeypatch.setattr(HfApi, 'upload_folder', lambda api, **kw: calls.append(('upload', kw['repo_id'], kw['folder_path']))
                        or CommitInfo(f"https://huggingface.co/{kw['repo_id']}/commit/1", '', '', '1'))
    monkeypatch.setattr(export, 'hub_offline', lambda: False)
    monkeypatch.setattr(export, 'hub_reachable', lambda *a, **k: True)
    notes = []
    cfg = {**good(micro), 'output': {'push_to_hub': 'someone/ties', 'private': True}}
    out = run_merge(cfg, tmp_path/'pushed', progress=False, log=notes.append)
    assert calls == [('create', 'someone/ties', True), ('upload', 'someone/ties', str(out))]
    assert notes[-1] == 'pushed to the Hugging Face Hub: https://huggingface.co/someone/ties/commit/1'
    assert 'from_pretrained("someone/ties")' in (out/'README.md').read_text()
    (tmp_path/'ties.yaml').write_text(yaml.safe_dump(good(micro)))   # the command's flag does the same
    assert main(['merge', str(tmp_path/'ties.yaml'), '-o', str(tmp_path/'flag'), '--push-to-hub', 'someone/other', '--no-progress']) == 0
    assert calls[-2:] == [('create', 'someone/other', False), ('upload', 'someone/other', str(tmp_path/'flag'))]
