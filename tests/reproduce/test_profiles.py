"Profiles from settings.ini: parsing, checks, hub access (fail fast, or run offline from the caches), prepare()."
import http.server, json, os, re, socket, threading, time
from pathlib import Path

import pytest

import fusion_nb.tiny.build
from fusion_nb.core import FusionError, UnknownNameError
from fusion_nb.reproduce.profiles import hub_reachable, list_profiles, load_profile, missing_from_cache, prepare

SETTINGS = """
[DEFAULT]
seed = 7
batch_size = 16
tasks = cars svhn mnist
class_names = catalog
[local]
description = local models and datasets
build = micro
pretrained = ./models/clip
expert_template = ./models/clip_{task}
expert.mnist = /abs/mnist_expert
dataset_template = ../shared/datasets/{task}
[hubby]
hub = true
device = cuda
dtype = bf16
max_test_samples = 200
pretrained = owner/clip-base
expert_template = owner/clip-base_{task}
expert.cars = owner/clip-base_stanford-cars
dataset_template = owner/{task}
dataset.svhn = someone/svhn:cropped_digits
extra_knob = 0.5
"""

def declare(root, *names):
    "An experiment notebook under `root` whose parameters cell declares `names` (so settings.ini may set them)."
    import nbformat
    nb = nbformat.v4.new_notebook(); c = nbformat.v4.new_code_cell('\n'.join(f'{n} = None' for n in names))
    c.metadata['tags'] = ['parameters']; nb.cells = [c]
    (root/'nbs'/'experiments').mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(root/'nbs'/'experiments'/'00_x.ipynb'))

@pytest.fixture
def settings(tmp_path):
    p = tmp_path/'project'/'settings.ini'; p.parent.mkdir()
    p.write_text(SETTINGS)
    declare(p.parent, 'profile', 'output_dir', 'extra_knob')
    return p

def test_templates_overrides_and_paths(settings):
    root = settings.parent
    p = load_profile('local', settings=settings)
    assert (p.name, p.root, p.tasks, p.seed, p.batch_size, p.build, p.hub) == ('local', root, ['cars', 'svhn', 'mnist'], 7, 16, 'micro', False)
    assert p.pretrained == str(root/'models'/'clip')                       # ./ → under the folder of settings.ini
    assert p.experts == {'cars': str(root/'models'/'clip_cars'), 'svhn': str(root/'models'/'clip_svhn'), 'mnist': '/abs/mnist_expert'}
    assert p.datasets['svhn'] == str(root.parent/'shared'/'datasets'/'svhn')  # ../ resolved too
    assert p.hub_sources() == {'models': [], 'datasets': []}
    h = load_profile('hubby', settings=settings)
    assert h.experts == {'cars': 'owner/clip-base_stanford-cars', 'svhn': 'owner/clip-base_svhn', 'mnist': 'owner/clip-base_mnist'}
    assert h.datasets == {'cars': 'owner/cars', 'svhn': 'someone/svhn:cropped_digits', 'mnist': 'owner/mnist'}  # id:config kept
    assert (h.hub, h.device, h.dtype, h.max_test_samples, h.extra) == (True, 'cuda', 'bf16', 200, {'extra_knob': '0.5'})
    assert h.hub_sources()['datasets'] == ['owner/cars', 'someone/svhn:cropped_digits', 'owner/mnist']
    assert list_profiles(settings) == ['local', 'hubby']

def test_overrides_and_params(settings):
    p = load_profile('hubby', settings=settings, batch_size=4, tasks=['mnist'], device=None)
    assert (p.batch_size, p.tasks, p.device, list(p.experts)) == (4, ['mnist'], 'cuda', ['mnist'])
    params = p.params()
    assert json.loads(json.dumps(params)) == params                        # simple values only (papermill can inject them)
    assert params['tasks'] == ['mnist'] and params['extra_knob'] == '0.5' and params['hub'] is True
    assert not {'root', 'experts', 'datasets', 'extra'} & set(params)

def test_default_profile_is_tiny(monkeypatch, tmp_path):
    (tmp_path/'settings.ini').write_text(SETTINGS.replace('[local]', '[tiny]')); declare(tmp_path, 'extra_knob')
    monkeypatch.setenv('FUSION_NB_ROOT', str(tmp_path))
    assert load_profile().name == 'tiny' and load_profile().pretrained == str(tmp_path/'models'/'clip')

def test_unknown_profile_lists_the_profiles(settings):
    with pytest.raises(UnknownNameError, match=r"unknown profile 'nope'\. Profiles in .*settings.ini: local, hubby"):
        load_profile('nope', settings=settings)
    with pytest.raises(FusionError, match="settings file .*missing.ini' does not exist"):
        load_profile('local', settings=settings.parent/'missing.ini')

@pytest.mark.parametrize('key, value, why', [
    ('batch_size', 'lots', 'expected an integer'), ('batch_size', '0', 'expected an integer ≥ 1'),
    ('max_test_samples', '-1', 'expected an integer ≥ 0'), ('num_workers', '1.5', 'expected an integer'),
    ('seed', 'x', 'expected an integer'), ('hub', 'maybe', 'expected true or false'),
    ('class_names', 'wordnet', "expected 'catalog' or 'dataset'"), ('device', 'gpu', "expected 'auto', 'cpu'"),
    ('dtype', 'float13', "unknown dtype 'float13'"), ('tasks', '', 'no task names'), ('tasks', 'a b a', 'a task is named twice'),
])
def test_bad_values_name_profile_and_key(settings, key, value, why):
    settings.write_text(SETTINGS + f"[bad]\npretrained = owner/clip\n{key} = {value}\n")
    load_profile('hubby', settings=settings)   # the other profiles still load
    with pytest.raises(FusionError) as e:
        load_profile('bad', settings=settings)
    assert f"profile 'bad': {key} = {value!r} is invalid: {why}" in str(e.value)

@pytest.mark.parametrize('key, hint', [('bach_size', "(did you mean 'batch_size'"), ('max_tests_samples', "(did you mean 'max_test_samples'"),
                                       ('adamerging_step', "(did you mean 'adamerging_steps'"), ('zzz', ". Known keys: adamerging_lr")])
def test_unknown_keys_are_refused(settings, key, hint):
    "A misspelt key would silently run with the default: refused, naming profile, file and key, with a suggestion."
    settings.write_text(SETTINGS + f"[bad]\npretrained = owner/clip\n{key} = 3\n")
    load_profile('hubby', settings=settings)
    with pytest.raises(FusionError) as e:
        load_profile('bad', settings=settings)
    assert f"profile 'bad' in {settings}: unknown key {key!r}" in str(e.value) and hint in str(e.value)

def test_budget_keys_stay_accepted_and_match_the_methods():
    "Every budget fusion_nb.reproduce.rows reads is a known key (the settings.ini header lists the same)."
    from fusion_nb.reproduce.rows import FUSION_SETTINGS
    from fusion_nb.reproduce.profiles import BUDGET_KEYS
    assert set(FUSION_SETTINGS) == BUDGET_KEYS
    assert load_profile('tiny', adamerging_steps=7, wemoe_lr=1e-3).extra['adamerging_steps'] == '7'
    header = (Path(__file__).parents[2]/'settings.ini').read_text().split('[DEFAULT]')[0]
    assert all(k in header for k in BUDGET_KEYS)

def test_non_utf8_settings_and_reserved_name(tmp_path):
    p = tmp_path/'settings.ini'
    p.write_bytes(b'[p]\npretrained = a/b\n# r\xe9sum\xe9\n')
    with pytest.raises(FusionError, match=r"settings.ini is not UTF-8 text: byte 0xe9 on line 3; save the file as UTF-8"):
        list_profiles(p)
    p.write_text('[scratch]\npretrained = a/b\n')
    with pytest.raises(FusionError, match="a profile cannot be named 'scratch'"):
        load_profile('scratch', settings=p)

def test_missing_pretrained(settings):
    settings.write_text(SETTINGS.replace('pretrained = owner/clip-base\n', ''))
    with pytest.raises(FusionError, match="profile 'hubby': missing key 'pretrained'"):
        load_profile('hubby', settings=settings)

def test_real_settings_profiles():
    "The project's own profiles all parse; the paper profiles name paper 000's hub ids."
    assert {'tiny', 'micro', 'clip-vit-b32', 'clip-vit-l14'} <= set(list_profiles())
    for name in list_profiles(): load_profile(name)
    l14 = load_profile('clip-vit-l14')
    assert l14.pretrained == 'openai/clip-vit-large-patch14' and l14.experts['gtsrb'] == 'tanganke/clip-vit-large-patch14_gtsrb'
    assert l14.datasets['mnist'] == 'ylecun/mnist' and l14.hub and l14.max_test_samples == 0 and l14.test_split == 'test'

# --- hub access -------------------------------------------------------------------------------------------------

def test_hub_reachable(monkeypatch):
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self): self.send_response(404); self.end_headers()
        def log_message(self, *a): pass
    srv = http.server.HTTPServer(('127.0.0.1', 0), NotFound)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    silent = socket.socket(); silent.bind(('127.0.0.1', 0)); silent.listen()   # accepts connections, never answers
    closed = socket.socket(); closed.bind(('127.0.0.1', 0)); port = closed.getsockname()[1]; closed.close()
    try:
        assert hub_reachable(endpoint=f'http://127.0.0.1:{srv.server_port}')       # any HTTP answer counts
        assert not hub_reachable(timeout=2, endpoint=f'http://127.0.0.1:{port}')   # connection refused
        t0 = time.time()
        assert not hub_reachable(timeout=1, endpoint=f'http://127.0.0.1:{silent.getsockname()[1]}')
        assert time.time() - t0 < 2.5                                              # bounded by the timeout
        monkeypatch.setenv('HF_HUB_OFFLINE', '1')
        assert not hub_reachable(endpoint=f'http://127.0.0.1:{srv.server_port}')   # offline mode: not even asked
    finally:
        srv.shutdown(); silent.close()

def fake_model(cache, repo, weights=True):
    "A hub-cache entry as huggingface_hub lays it out: refs/main → snapshots/<commit>/."
    d = cache/('models--' + repo.replace('/', '--')); commit = 'c' * 40
    (d/'refs').mkdir(parents=True); (d/'refs'/'main').write_text(commit)
    snap = d/'snapshots'/commit; snap.mkdir(parents=True)
    (snap/'config.json').write_text('{}')
    if weights: (snap/'model.safetensors').write_bytes(b'0')

def fake_dataset(cache, source):
    "A dataset prepared by `datasets`: <owner>___<name>/<config>/<version>/<hash>/."
    repo, _, config = source.partition(':')
    (cache/repo.replace('/', '___')/(config or 'default')/'0.0.0'/('f' * 16)).mkdir(parents=True)

@pytest.fixture
def caches(tmp_path, monkeypatch):
    import datasets.config, huggingface_hub.constants
    hub, ds = tmp_path/'hub', tmp_path/'datasets'
    hub.mkdir(); ds.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(hub))
    monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', ds)
    return hub, ds

def test_missing_from_cache(settings, caches):
    hub, ds = caches
    p = load_profile('hubby', settings=settings)
    everything = ['owner/clip-base', 'owner/clip-base_stanford-cars', 'owner/clip-base_svhn', 'owner/clip-base_mnist',
                  'dataset owner/cars', 'dataset someone/svhn:cropped_digits', 'dataset owner/mnist']
    assert missing_from_cache(p) == everything
    fake_model(hub, 'owner/clip-base'); fake_model(hub, 'owner/clip-base_svhn', weights=False)   # config only: not usable
    fake_dataset(ds, 'owner/cars'); fake_dataset(ds, 'someone/svhn:full_numbers')               # another config: not usable
    assert missing_from_cache(p) == [m for m in everything if m not in ('owner/clip-base', 'dataset owner/cars')]
    assert load_profile('local', settings=settings).hub_sources() == {'models': [], 'datasets': []}

def test_hub_profile_offline_fails_at_once(settings, caches, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    p = load_profile('hubby', settings=settings, device='cpu')   # its cuda is checked before the hub: test_device_is_checked_before_the_hub
    t0 = time.time()
    with pytest.raises(FusionError) as e:
        prepare(p, log=lambda s: None)
    assert time.time() - t0 < 5
    msg = str(e.value)
    for part in ["profile 'hubby' needs the Hugging Face Hub", 'HF_HUB_OFFLINE is set', '7 of its models/datasets',
                 'owner/clip-base', 'run it on a machine with hub access', 'HF_HOME', '--profile tiny']:
        assert part in msg, part

def test_hub_profile_runs_offline_from_complete_caches(settings, caches, monkeypatch):
    hub, ds = caches
    monkeypatch.setenv('HF_HUB_OFFLINE', '1'); monkeypatch.delenv('HF_DATASETS_OFFLINE', raising=False)
    p = load_profile('hubby', settings=settings, device='cpu')   # its cuda is checked once the hub is: tested below
    for m in p.hub_sources()['models']: fake_model(hub, m)
    for d in p.hub_sources()['datasets']: fake_dataset(ds, d)
    notes = []
    assert prepare(p, log=notes.append) is p
    assert 'running offline' in notes[0] and os.environ['HF_DATASETS_OFFLINE'] == '1'

def test_local_profile_goes_offline_and_builds(settings, monkeypatch):
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False); monkeypatch.delenv('HF_DATASETS_OFFLINE', raising=False)
    calls = []
    monkeypatch.setattr(fusion_nb.tiny.build, 'build_benchmark', lambda **kw: calls.append(kw))
    p = load_profile('local', settings=settings)
    prepare(p, progress=False)
    assert os.environ['HF_HUB_OFFLINE'] == '1' and os.environ['HF_DATASETS_OFFLINE'] == '1'
    assert calls == [{'scale': 'micro', 'root': settings.parent, 'progress': False}]
    prepare(p, build=False)
    with pytest.raises(FusionError, match='no such folder'):   # without a builder, its absent local folders are named at once (issue 27)
        prepare(load_profile('local', settings=settings, build=''))
    assert len(calls) == 1

def test_cuda_profile_without_a_gpu_fails_in_prepare(settings, caches, monkeypatch):
    "device = cuda on a machine without CUDA: a FusionError naming the profile before anything runs, not a bare AssertionError later."
    import torch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    hub, ds = caches
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    p = load_profile('hubby', settings=settings)
    for m in p.hub_sources()['models']: fake_model(hub, m)
    for d in p.hub_sources()['datasets']: fake_dataset(ds, d)
    with pytest.raises(FusionError, match="profile 'hubby': device 'cuda' requested but CUDA is not available on this machine; use device='cpu'"):
        prepare(p, log=lambda s: None)


# --- issue 27: everything a profile reads named at once, the device first, nothing left behind by a failed check ---

def test_device_and_missing_sources_in_one_message(settings, caches, monkeypatch):
    "Issue 54: a CPU machine without the hub is told about the GPU first and, in the same message, every missing source."
    import torch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    with pytest.raises(FusionError) as e: prepare(load_profile('hubby', settings=settings), log=lambda s: None)
    msg = str(e.value)
    assert msg.startswith("profile 'hubby': device 'cuda' requested but CUDA is not available")
    everything = ['owner/clip-base', 'owner/clip-base_stanford-cars', 'owner/clip-base_svhn', 'owner/clip-base_mnist',
                  'owner/cars', 'someone/svhn:cropped_digits', 'owner/mnist']   # the profile's keys, read by hand
    assert "needs the Hugging Face Hub" in msg and '7 of its models/datasets' in msg and all(f'= {v}: hub' in msg for v in everything)
    # a profile of local folders (no hub, no builder): its absent folders come with the device too
    settings.write_text(settings.read_text() + "[gpu-local]\ndevice = cuda\npretrained = ./models/nowhere\nexpert_template = ./models/nowhere_{task}\n"
                        "dataset_template = ./data/{task}\n")
    with pytest.raises(FusionError) as e: prepare(load_profile('gpu-local', settings=settings), log=lambda s: None)
    msg = str(e.value)
    assert msg.startswith("profile 'gpu-local': device 'cuda' requested") and f"pretrained = {settings.parent/'models'/'nowhere'}: no such folder" in msg
    # everything there: the device alone
    for m in load_profile('hubby', settings=settings).hub_sources()['models']: fake_model(caches[0], m)
    for d in load_profile('hubby', settings=settings).hub_sources()['datasets']: fake_dataset(caches[1], d)
    with pytest.raises(FusionError) as e: prepare(load_profile('hubby', settings=settings), log=lambda s: None)
    assert str(e.value).startswith("profile 'hubby': device 'cuda' requested") and '\n' not in str(e.value)

def test_a_failed_check_leaves_no_profile_folder(settings, caches, monkeypatch, tmp_path):
    import fusion_nb.reproduce.runner as runner
    monkeypatch.setattr(runner, 'experiment_parameters', lambda nb, profile: {})   # the toy notebook has no kernel to read it with
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    with pytest.raises(FusionError, match="profile 'hubby'"):   # its device or the hub, whichever fails first
        runner.reproduce('hubby', settings=settings, output_root=tmp_path/'outputs', progress=False, log=lambda s: None)
    assert not (tmp_path/'outputs'/'hubby').exists()

def _paper_profile_sources(cp, name, root):
    "What a paper profile's experiments read, from settings.ini's text: the values of its keys, ./ paths made absolute."
    from fusion_nb.tiny.tasks import NEULIG_TASKS
    sec, absolute = cp[name], lambda v: str((root/v).resolve()) if v.startswith('./') else v
    exps = sec.get('experiments', '').split()
    tasks = sec['tasks'].split() + [t for t in NEULIG_TASKS if '10' in exps and t not in sec['tasks'].split()]
    robust = any(k.startswith('robust_checkpoints_') for k in sec)
    out = {} if robust else {'pretrained': sec['pretrained']}
    for kind in ('expert', 'dataset'):
        for t in tasks:
            if v := sec.get(f'{kind}.{t}') or sec.get(f'{kind}_template', '').replace('{task}', t): out[f'{kind}.{t}'] = v
    for key in [k for k in sec if k.startswith('robust_checkpoints_')]:
        out.update({f'{key} {i.split("=")[0]}': i.split('=', 1)[1] for i in sec[key].split()})
    for key in ('llava_held_in', 'llava_held_out', 'llava_validation'):
        out.update({f'{key} {i.split("=")[0]}': i.split('=', 1)[1] if '=' in i else '' for i in sec.get(key, '').split()})
    out.update({'soup_ingredients': v for v in sec.get('soup_ingredients', '').split()})
    return {k: absolute(v) for k, v in out.items()}

def test_offline_message_names_every_source_of_every_paper_profile(caches, monkeypatch):
    "Every hub profile of the project's settings.ini, offline with empty caches: one message naming everything its experiments read."
    import configparser
    from fusion_nb.core import project_root
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    cp = configparser.ConfigParser(interpolation=None); cp.read(project_root()/'settings.ini', encoding='utf-8')
    paper = [n for n in cp.sections() if cp[n].get('hub', 'false').strip() == 'true']
    assert {'clip-vit-b32', 'clip-vit-l14', 'llava-1.5-7b', 'clip-vit-b32-imagenet', 'robust-soups'} <= set(paper)
    for name in paper:
        with pytest.raises(FusionError) as e: prepare(load_profile(name, device='cpu'), log=lambda s: None)
        msg, expected = str(e.value), _paper_profile_sources(cp, name, project_root())
        for key, value in expected.items():
            assert f'{key} = {value}' in msg if value else f'{key} = ' in msg, (name, key, value)
        if cp[name].get('llava_finetunes', None) == '': assert 'llava_finetunes is empty' in msg
        assert 'save_to_disk' not in msg or not any(k.startswith('robust_checkpoints_') for k in cp[name]), name   # files are read as they are
    b32 = _paper_profile_sources(cp, 'clip-vit-b32', project_root())
    assert {'expert.cifar10', 'expert.cifar100', 'expert.stl10', 'dataset.cifar10', 'dataset.cifar100', 'dataset.stl10'} <= set(b32)
    assert len([k for k in _paper_profile_sources(cp, 'llava-1.5-7b', project_root()) if k.startswith('llava_held')]) == 12
    assert len([k for k in _paper_profile_sources(cp, 'robust-soups', project_root()) if k.startswith('robust_checkpoints')]) == 31

def test_local_profile_checks_every_dataset_before_any_model_work(settings, tmp_path):
    "A profile of local folders (no builder): a missing expert and an unreadable dataset folder are named together by prepare."
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image as ImageFeature
    from PIL import Image
    root = settings.parent
    for t in ('cars', 'svhn', 'mnist'): (root/'models'/f'clip_{t}').mkdir(parents=True, exist_ok=True)
    (root/'models'/'clip').mkdir(exist_ok=True)
    f = Features({'image': ImageFeature(), 'label': ClassLabel(names=['a', 'b'])})
    DatasetDict(test=Dataset.from_dict({'image': [Image.new('RGB', (4, 4))], 'label': [1]}, features=f)).save_to_disk(str(root/'data'/'cars'))
    DatasetDict(test=Dataset.from_dict({'picture': [1], 'label': [0]})).save_to_disk(str(root/'data'/'svhn'))   # no image column
    (root/'data'/'mnist').mkdir(parents=True)                                                                  # neither layout
    settings.write_text(settings.read_text() + "[mirror]\npretrained = ./models/clip\nexpert_template = ./models/clip_{task}\n"
                        "expert.mnist = ./models/nowhere\ndataset_template = ./data/{task}\n")
    with pytest.raises(FusionError) as e: prepare(load_profile('mirror', settings=settings), log=lambda s: None)
    msg = str(e.value)
    assert "profile 'mirror' cannot run: 3 of the sources" in msg
    assert f"expert.mnist = {root/'models'/'nowhere'}: no such folder" in msg
    assert "dataset of task 'svhn' lacks column(s) ['image']" in msg
    assert "'mnist': " in msg and "is not a dataset saved with save_to_disk, nor one in the hub's layout" in msg

def test_a_renamed_copy_of_a_paper_profile_is_compared_with_the_paper(tmp_path):
    "paper_model = clip-vit-b32 in a copy under another name: the paper's rows are found (by name alone they were not)."
    import configparser, re
    from fusion_nb.core import project_root
    from fusion_nb.reproduce.reports import load_paper_values, paper_model, paper_table
    cp = configparser.ConfigParser(interpolation=None); cp.read(project_root()/'settings.ini', encoding='utf-8')
    copy = dict(cp['clip-vit-b32'])
    (tmp_path/'settings.ini').write_text('[my-mirror]\n' + ''.join(f'{k} = {v}\n' for k, v in copy.items())
                                         + 'paper_model = clip-vit-b32\n')
    P = load_profile('my-mirror', settings=tmp_path/'settings.ini')
    assert paper_model(P) == 'clip-vit-b32' and 'paper_model' in P.params()   # a changed key reruns the comparison
    pv = load_paper_values(project_root())
    rows = ['Task Arithmetic', 'Simple Averaging', 'task_arithmetic', 'simple_average']
    assert paper_table(pv, paper_model(P), rows, P.tasks, table='multi_task').notna().any().any()
    assert paper_table(pv, P.name, rows, P.tasks, table='multi_task').empty   # by the profile's name: nothing
    # every experiment notebook looks the paper's values up through paper_model, never by the profile's name
    for nb in sorted((project_root()/'nbs'/'experiments').glob('*.ipynb')):
        src = nb.read_text(encoding='utf-8')
        assert not re.search(r"paper_(table|rows|wide)\([^)\n]*P\.name|\['model'\] == P\.name", src), nb.name
        for c in json.loads(src)['cells']:   # and still compiles (an edited import once did not)
            if c['cell_type'] == 'code': compile('\n'.join(l for l in ''.join(c['source']).split('\n') if not l.lstrip().startswith(('%', '!'))), nb.name, 'exec')

def test_budget_ranges_agree_with_the_declarations():
    "settings.ini's budget checks (BUDGET_RANGES) use the type and interval of every method hyperparameter each key sets."
    from fusion_nb.merge import MERGE_METHODS
    from fusion_nb.reproduce.profiles import BUDGET_KEYS, BUDGET_RANGES
    seen = set()
    for n in MERGE_METHODS.names():
        m = MERGE_METHODS[n]
        for hyper, key in m.budgets.items():
            assert BUDGET_RANGES[key] == (m.hypers[hyper].type, m.hypers[hyper].interval), (n, hyper, key)
            seen.add(key)
    assert seen == set(BUDGET_RANGES) == BUDGET_KEYS

def test_every_budget_of_every_profile_is_valid_and_a_bad_one_names_file_profile_and_key(tmp_path):
    from fusion_nb.reproduce.profiles import list_profiles, load_profile
    for name in list_profiles(): load_profile(name)   # the shipped settings.ini passes the new checks
    ini = tmp_path/'settings.ini'
    for key, value, why in [('adamerging_steps', '-5', 'an integer in [0, inf)'), ('wemoe_lr', '0', 'a number in (0, inf)'),
                            ('fisher_examples', '0', 'an integer in [1, inf)'), ('neulig_lr', 'nan', 'a number in (0, inf)'),
                            ('tta_batch_size', 'eight', 'an integer in [1, inf)')]:
        ini.write_text(f'[p]\npretrained = a/b\ntasks = x\n{key} = {value}\n')
        with pytest.raises(FusionError, match=re.escape(f"profile 'p' in {ini}: {key} = '{value}' is invalid: expected {why}")):
            load_profile('p', settings=ini)
    ini.write_text('[p]\npretrained = a/b\ntasks = x\nadamerging_steps = 0\nwemoe_lr = 1e-9\nfisher_examples = 1\n')
    load_profile('p', settings=ini)   # the smallest allowed values


# --- issue 54: the pre-check reads what the selected experiments read; the beyond-the-paper switch -------------------

def test_the_pre_check_lists_only_what_the_selected_experiments_read(caches, monkeypatch):
    "clip-vit-b32 offline with empty caches: `--only 00`'s message and cache advice name 00's sources, not experiment 10's CIFAR and STL."
    from fusion_nb.reproduce.profiles import EXPERIMENT_ENV, profile_sources
    monkeypatch.setenv('HF_HUB_OFFLINE', '1'); monkeypatch.delenv(EXPERIMENT_ENV, raising=False); monkeypatch.delenv('JPY_SESSION_NAME', raising=False)
    p = load_profile('clip-vit-b32', device='cpu')
    ten = {'tanganke/clip-vit-base-patch32_cifar10', 'tanganke/clip-vit-base-patch32_stl10', 'dataset tanganke/cifar100'}
    assert ten <= set(missing_from_cache(p))                                         # the whole profile: experiment 10's too
    only00 = missing_from_cache(p, experiments=['00_individual'])
    assert not ten & set(only00) and len(only00) == 1 + 8 + 8                         # CLIP, its eight experts, eight datasets
    assert 'expert.cifar10' in [s.key for s in profile_sources(p, ['10'])] and 'expert.cifar10' in [s.key for s in profile_sources(p, '10')]
    for how in ('argument', 'kernel'):   # the runner's selection, or the experiment its kernel runs
        if how == 'kernel': monkeypatch.setenv(EXPERIMENT_ENV, '00_individual')
        with pytest.raises(FusionError) as e: prepare(p, log=lambda s: None, **({'experiments': ['00_individual']} if how == 'argument' else {}))
        msg = str(e.value)
        assert '17 of its models/datasets (everything experiment 00_individual read)' in msg and 'cifar' not in msg and 'stl10' not in msg, how
        assert '`fusion-nb reproduce --profile clip-vit-b32 --only 00_individual`' in msg
    monkeypatch.delenv(EXPERIMENT_ENV)
    with pytest.raises(FusionError, match='everything its experiments read'): prepare(p, log=lambda s: None)

def test_the_beyond_switch_reaches_the_notebooks(tmp_path):
    "The profile key `beyond` (on for tiny and micro, off for the paper-000 profiles, on when absent) is 01's and 04's parameter."
    from fusion_nb.core import project_root
    from fusion_nb.reproduce.fingerprints import experiment_parameters, notebook_parameters
    from fusion_nb.reproduce.runner import sweep_points
    exp = project_root()/'nbs'/'experiments'
    notebooks = [exp/'01_multi_task_merging.ipynb', exp/'04_fusion_eight_tasks.ipynb']
    for nb in notebooks: assert notebook_parameters(nb)['beyond']['default'] == 'None', nb.name   # None: the profile's key
    for name, on in (('tiny', True), ('micro', True), ('clip-vit-b32', False), ('clip-vit-l14', False)):
        p = load_profile(name)
        assert p.beyond is on and all(experiment_parameters(nb, p)['beyond'] is on for nb in notebooks), name
    assert experiment_parameters(notebooks[0], load_profile('tiny', beyond='off'))['beyond'] is False
    assert 'beyond' not in experiment_parameters(exp/'00_individual.ipynb', load_profile('tiny'))   # only where a notebook declares it
    assert sweep_points(notebooks[1], {'beyond': ['false', 'true']}, load_profile('clip-vit-b32')) == [{'beyond': False}, {'beyond': True}]
    ini = tmp_path/'settings.ini'
    ini.write_text("[own]\npretrained = ./m\ntasks = a\n[bad]\npretrained = ./m\ntasks = a\nbeyond = maybe\n")
    assert load_profile('own', settings=ini).beyond is True                                  # absent: on, as before the switch
    with pytest.raises(FusionError, match=r"profile 'bad': beyond = 'maybe' is invalid: expected true or false"): load_profile('bad', settings=ini)
